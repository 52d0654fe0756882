package hamiaccounting

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Full method names of the calls that have a policy of their own.
const (
	MethodCheckQuota         = "/hami.accounting.v1.Admission/CheckQuota"
	MethodFilter             = "/hami.accounting.v1.Scheduler/Filter"
	MethodRecordPod          = "/hami.accounting.v1.UsageRecorder/RecordPod"
	MethodForgetPod          = "/hami.accounting.v1.UsageRecorder/ForgetPod"
	MethodReserve            = "/hami.accounting.v1.UsageRecorder/Reserve"
	MethodReleaseReservation = "/hami.accounting.v1.UsageRecorder/ReleaseReservation"
	MethodGetPodUsage        = "/hami.accounting.v1.UsageRecorder/GetPodUsage"
	MethodGetNodeUsage       = "/hami.accounting.v1.UsageRecorder/GetNodeUsage"
	MethodGetNamespaceUsage  = "/hami.accounting.v1.UsageRecorder/GetNamespaceUsage"
	MethodRegisterNode       = "/hami.accounting.v1.UsageRecorder/RegisterNode"
	MethodSetQuota           = "/hami.accounting.v1.UsageRecorder/SetQuota"
	MethodGetPolicy          = "/hami.accounting.v1.UsageRecorder/GetPolicy"
)

// CallPolicy is how one method is called. Each attempt gets Timeout as its
// deadline (none when zero); a failure Retryable reports is tried again until
// Attempts attempts were made in all, after waiting Backoff times the number
// of attempts made so far. The caller's context bounds the whole: once its
// deadline passes or it is cancelled, no further attempt starts.
type CallPolicy struct {
	Timeout  time.Duration
	Attempts int
	Backoff  time.Duration
}

// Policies maps full method names to their CallPolicy; Other applies to every
// method not in Methods.
type Policies struct {
	Methods map[string]CallPolicy
	Other   CallPolicy
}

// doc:begin policies
// DefaultPolicies are the deadlines and retries of docs/go-clients.md.
//
//   - CheckQuota: 2 s per attempt, 3 attempts, 100 ms then 200 ms apart: at
//     most 6.3 s, inside the 10 s a Kubernetes webhook call may take, and a
//     check stores nothing, so trying again is always safe.
//   - Filter: 25 s, one attempt, inside the extender's 30 s HTTP timeout. A
//     Filter reserves what it places; kube-scheduler retries the pod.
//   - Reserve, ReleaseReservation: 5 s, one attempt: whoever fitted the grants
//     reads GetPodUsage and decides again.
//   - RecordPod, ForgetPod, RegisterNode, SetQuota (idempotent: the same state
//     again changes nothing) and the reads: 5 s, 3 attempts, 200 ms apart.
//   - Anything else (the health service, a method added later): 5 s, once.
func DefaultPolicies() Policies {
	idempotent := CallPolicy{Timeout: 5 * time.Second, Attempts: 3, Backoff: 200 * time.Millisecond}
	once := CallPolicy{Timeout: 5 * time.Second, Attempts: 1}
	return Policies{
		Methods: map[string]CallPolicy{
			MethodCheckQuota:         {Timeout: 2 * time.Second, Attempts: 3, Backoff: 100 * time.Millisecond},
			MethodFilter:             {Timeout: 25 * time.Second, Attempts: 1},
			MethodReserve:            once,
			MethodReleaseReservation: once,
			MethodRecordPod:          idempotent,
			MethodForgetPod:          idempotent,
			MethodRegisterNode:       idempotent,
			MethodSetQuota:           idempotent,
			MethodGetPodUsage:        idempotent,
			MethodGetNodeUsage:       idempotent,
			MethodGetNamespaceUsage:  idempotent,
			MethodGetPolicy:          idempotent,
		},
		Other: once,
	}
}

// Retryable reports whether a failed call may be tried again: the daemon (or
// the recorder behind it) was unreachable, or the attempt's deadline passed.
// INVALID_ARGUMENT (the request is wrong and stays wrong) and every other code
// are final.
func Retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// doc:end policies

// For returns the policy of a full method name.
func (p Policies) For(method string) CallPolicy {
	if policy, ok := p.Methods[method]; ok {
		return policy
	}
	return p.Other
}

// With returns a copy of p in which method has policy (p is not changed).
func (p Policies) With(method string, policy CallPolicy) Policies {
	methods := make(map[string]CallPolicy, len(p.Methods)+1)
	for name, existing := range p.Methods {
		methods[name] = existing
	}
	methods[method] = policy
	return Policies{Methods: methods, Other: p.Other}
}

// doc:begin interceptor
// UnaryClientInterceptor applies p to every unary call of a connection (Dial
// installs it). The reply is decoded only from the attempt that succeeded.
func (p Policies) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, request, reply interface{},
		conn *grpc.ClientConn, invoke grpc.UnaryInvoker, options ...grpc.CallOption) error {
		policy := p.For(method)
		for attempt := 1; ; attempt++ {
			err := invokeOnce(ctx, policy.Timeout, method, request, reply, conn, invoke, options)
			if err == nil || attempt >= policy.Attempts || !Retryable(err) || ctx.Err() != nil {
				return err
			}
			wait := time.NewTimer(time.Duration(attempt) * policy.Backoff)
			select {
			case <-ctx.Done():
				wait.Stop()
				return err
			case <-wait.C:
			}
		}
	}
}

func invokeOnce(ctx context.Context, timeout time.Duration, method string, request, reply interface{},
	conn *grpc.ClientConn, invoke grpc.UnaryInvoker, options []grpc.CallOption) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return invoke(ctx, method, request, reply, conn, options...)
}

// doc:end interceptor
