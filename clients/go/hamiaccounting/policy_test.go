package hamiaccounting

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	accountingv1 "github.com/hami-accounting/hami-accounting/clients/go/accountingv1"
)

func TestRetryableIsOnlyUnreachableOrTooSlow(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"the daemon or the recorder behind it is unreachable", status.Error(codes.Unavailable, "down"), true},
		{"the attempt's deadline passed", status.Error(codes.DeadlineExceeded, "slow"), true},
		{"malformed input stays malformed", status.Error(codes.InvalidArgument, "bad pod"), false},
		{"success is not retried", nil, false},
		{"a daemon bug is not hidden by retries", status.Error(codes.Internal, "bug"), false},
		{"too many watch streams is the caller's to back off", status.Error(codes.ResourceExhausted, "cap"), false},
		{"a missing connection stays missing", status.Error(codes.FailedPrecondition, "no conn"), false},
		{"the caller cancelled", status.Error(codes.Canceled, "cancelled"), false},
		{"an unknown method", status.Error(codes.Unimplemented, "no such method"), false},
		{"an error that is not a gRPC status", errors.New("plain"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Retryable(tc.err); got != tc.want {
				t.Fatalf("Retryable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestCallPolicyRetriesWhatIsRetryableAndNothingElse(t *testing.T) {
	pod := []byte(`{"metadata":{"name":"p","uid":"u-1"}}`)
	fast := CallPolicy{Timeout: 2 * time.Second, Attempts: 3, Backoff: time.Millisecond}
	cases := []struct {
		name     string
		method   string
		policy   *CallPolicy // nil: the default policy
		answers  []codes.Code
		block    map[int]bool
		call     func(*Client) error
		attempts int
		code     codes.Code
	}{
		{
			name:    "CheckQuota: UNAVAILABLE twice, then an answer on the third attempt",
			method:  MethodCheckQuota,
			answers: []codes.Code{codes.Unavailable, codes.Unavailable},
			call: func(c *Client) error {
				_, err := c.CheckQuota(context.Background(), pod)
				return err
			},
			attempts: 3, code: codes.OK,
		},
		{
			name:    "CheckQuota: INVALID_ARGUMENT is final at the first attempt",
			method:  MethodCheckQuota,
			answers: []codes.Code{codes.InvalidArgument},
			call: func(c *Client) error {
				_, err := c.CheckQuota(context.Background(), pod)
				return err
			},
			attempts: 1, code: codes.InvalidArgument,
		},
		{
			name:    "CheckQuota: UNAVAILABLE every time ends UNAVAILABLE after its 3 attempts",
			method:  MethodCheckQuota,
			answers: []codes.Code{codes.Unavailable, codes.Unavailable, codes.Unavailable, codes.Unavailable},
			call: func(c *Client) error {
				_, err := c.CheckQuota(context.Background(), pod)
				return err
			},
			attempts: 3, code: codes.Unavailable,
		},
		{
			name:    "CheckQuota: INTERNAL after UNAVAILABLE stops there",
			method:  MethodCheckQuota,
			answers: []codes.Code{codes.Unavailable, codes.Internal},
			call: func(c *Client) error {
				_, err := c.CheckQuota(context.Background(), pod)
				return err
			},
			attempts: 2, code: codes.Internal,
		},
		{
			name:    "Filter: one attempt, UNAVAILABLE goes back to kube-scheduler",
			method:  MethodFilter,
			answers: []codes.Code{codes.Unavailable},
			call: func(c *Client) error {
				_, err := c.Filter(context.Background(), pod, []string{"node-1"})
				return err
			},
			attempts: 1, code: codes.Unavailable,
		},
		{
			name:   "RecordPod: an attempt past its deadline is tried again",
			method: MethodRecordPod,
			policy: &CallPolicy{Timeout: 500 * time.Millisecond, Attempts: 3, Backoff: time.Millisecond},
			block:  map[int]bool{1: true},
			call: func(c *Client) error {
				_, err := c.RecordPod(context.Background(), pod)
				return err
			},
			attempts: 2, code: codes.OK,
		},
		{
			name:    "ForgetPod: UNAVAILABLE once, then released",
			method:  MethodForgetPod,
			policy:  &fast,
			answers: []codes.Code{codes.Unavailable},
			call: func(c *Client) error {
				_, err := c.ForgetPod(context.Background(), pod)
				return err
			},
			attempts: 2, code: codes.OK,
		},
		{
			name:    "a raw stub call on a dialled connection gets its method's policy too",
			method:  MethodGetNodeUsage,
			policy:  &fast,
			answers: []codes.Code{codes.Unavailable, codes.Unavailable},
			call: func(c *Client) error {
				_, err := c.Usage.GetNodeUsage(context.Background(), &accountingv1.GetNodeUsageRequest{NodeNames: []string{"n"}})
				return err
			},
			attempts: 3, code: codes.OK,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fakes := serveFakes(t, &script{answers: tc.answers, block: tc.block})
			var options []Option
			if tc.policy != nil {
				options = append(options, WithPolicy(tc.method, *tc.policy))
			}
			err := tc.call(fakes.client(t, options...))
			if got := status.Code(err); got != tc.code {
				t.Fatalf("ended %v (%v), want %v", got, err, tc.code)
			}
			arrivals := fakes.script.arrivals()
			if len(arrivals) != tc.attempts {
				t.Fatalf("%d attempts reached the daemon, want %d", len(arrivals), tc.attempts)
			}
			for _, seen := range arrivals {
				if seen.method != tc.method {
					t.Fatalf("attempt reached %s, want %s", seen.method, tc.method)
				}
			}
		})
	}
}

func TestEveryAttemptCarriesItsMethodsDeadline(t *testing.T) {
	fakes := serveFakes(t, &script{answers: []codes.Code{codes.Unavailable}})
	client := fakes.client(t)
	pod := []byte(`{"metadata":{"uid":"u-1"}}`)
	if _, err := client.CheckQuota(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Filter(context.Background(), pod, nil); err != nil {
		t.Fatal(err)
	}
	defaults := DefaultPolicies()
	arrivals := fakes.script.arrivals()
	if len(arrivals) != 3 {
		t.Fatalf("%d calls arrived, want 2 CheckQuota attempts and 1 Filter", len(arrivals))
	}
	for _, seen := range arrivals {
		limit := defaults.For(seen.method).Timeout
		if seen.deadline <= 0 || seen.deadline > limit {
			t.Errorf("%s arrived with %v left, want a deadline of at most %v", seen.method, seen.deadline, limit)
		}
	}
	// Each attempt has a deadline of its own, and Filter's is the longer one.
	if last := arrivals[2]; last.deadline <= defaults.For(MethodCheckQuota).Timeout {
		t.Errorf("Filter arrived with %v left: not its own 25 s deadline", last.deadline)
	}
}

// attemptCounter counts the attempts the call policy makes, also those that
// fail before they reach a daemon: an interceptor added with WithDialOptions
// runs once per attempt.
type attemptCounter struct {
	mu    sync.Mutex
	count int
}

func (a *attemptCounter) option() Option {
	return WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, request, reply interface{},
		conn *grpc.ClientConn, invoke grpc.UnaryInvoker, options ...grpc.CallOption) error {
		a.mu.Lock()
		a.count++
		a.mu.Unlock()
		return invoke(ctx, method, request, reply, conn, options...)
	}))
}

func (a *attemptCounter) attempts() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.count
}

func TestTheCallersContextBoundsTheRetries(t *testing.T) {
	pod := []byte(`{"metadata":{"uid":"u-1"}}`)
	patient := CallPolicy{Timeout: 5 * time.Second, Attempts: 3, Backoff: time.Millisecond}
	cases := []struct {
		name string
		ctx  func(s *script) (context.Context, context.CancelFunc)
	}{
		{"cancelled during the first attempt", func(s *script) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			s.answers = []codes.Code{codes.Unavailable, codes.Unavailable, codes.Unavailable}
			s.hook = func(int) { cancel() }
			return ctx, cancel
		}},
		{"its deadline passed during the first attempt (DEADLINE_EXCEEDED, yet final)", func(s *script) (context.Context, context.CancelFunc) {
			s.block = map[int]bool{1: true}
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{}
			ctx, cancel := tc.ctx(s)
			defer cancel()
			fakes := serveFakes(t, s)
			counter := &attemptCounter{}
			_, err := fakes.client(t, WithPolicy(MethodCheckQuota, patient), counter.option()).CheckQuota(ctx, pod)
			if err == nil {
				t.Fatal("the check answered OK")
			}
			if got := counter.attempts(); got != 1 {
				t.Fatalf("%d attempts once the caller's context was done, want 1", got)
			}
		})
	}
}

func TestPolicyWithLeavesTheOriginalAlone(t *testing.T) {
	defaults := DefaultPolicies()
	changed := defaults.With(MethodCheckQuota, CallPolicy{Timeout: time.Second, Attempts: 5})
	if got := changed.For(MethodCheckQuota).Attempts; got != 5 {
		t.Fatalf("changed policy has %d attempts, want 5", got)
	}
	if got := defaults.For(MethodCheckQuota).Attempts; got != 3 {
		t.Fatalf("the defaults changed too: %d attempts, want 3", got)
	}
	if got := defaults.For("/grpc.health.v1.Health/Check"); got != defaults.Other {
		t.Fatalf("an unlisted method got %+v, want the Other policy %+v", got, defaults.Other)
	}
}

func TestTheCheckQuotaPolicyFitsInsideAWebhookCall(t *testing.T) {
	// Kubernetes gives a webhook call at most 10 s (timeoutSeconds' default),
	// and the webhook must deny, not time out, when the daemon is down.
	policy := DefaultPolicies().For(MethodCheckQuota)
	worst := time.Duration(policy.Attempts) * policy.Timeout
	for attempt := 1; attempt < policy.Attempts; attempt++ {
		worst += time.Duration(attempt) * policy.Backoff
	}
	if worst >= 10*time.Second {
		t.Fatalf("CheckQuota can take %v in all: not inside a 10 s webhook call", worst)
	}
}
