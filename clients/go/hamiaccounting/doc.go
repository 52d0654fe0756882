// Package hamiaccounting calls the hami-accounting daemons the way HAMi's Go
// components do: the mutating webhook (Admission.CheckQuota), the scheduler
// extender's filter verb (Scheduler.Filter) and the pod informer
// (UsageRecorder.RecordPod and ForgetPod).
//
// Dial opens a connection to one daemon, plaintext or TLS (mutual TLS with a
// client certificate), and installs the call policy on it: every unary call
// gets its method's per-attempt deadline, and a failure Retryable reports
// (UNAVAILABLE, DEADLINE_EXCEEDED) is tried again where that is safe.
// INVALID_ARGUMENT and every other code are final. Client sends a pod as
// json.Marshal of whatever the caller holds (a corev1.Pod, its pointer, or any
// value that marshals to a Kubernetes Pod), joins the pod's trace through the
// W3C traceparent in the pod's hami.io/traceparent annotation, and passes the
// newest recorder revision its own writes were answered with to CheckQuota
// (read-your-writes through the admission daemon's cache).
//
// A minimal webhook:
//
//	conn, err := hamiaccounting.Dial(ctx, "dns:///hami-accounting-admission.hami-system.svc:50051")
//	if err != nil { ... }
//	client := hamiaccounting.NewClient(conn, nil, nil)
//	allowed, message := hamiaccounting.Verdict(client.CheckQuota(ctx, pod))
//
// The generated stubs (package accountingv1 of this module) are on Client for
// every other call; they go through the same call policy.
//
// The package builds against google.golang.org/grpc 1.33 (Debian 12) and
// every newer 1.x release: it uses grpc.DialContext and grpc.WithInsecure,
// which newer releases deprecate but keep throughout 1.x.
package hamiaccounting
