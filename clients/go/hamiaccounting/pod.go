package hamiaccounting

import (
	"context"
	"encoding/json"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	accountingv1 "github.com/hami-accounting/hami-accounting/clients/go/accountingv1"
)

// TraceparentAnnotation is the pod annotation that carries the pod's trace:
// CheckQuota answers with a W3C traceparent, the webhook stores it there, and
// every later call about the pod sends it along.
const TraceparentAnnotation = "hami.io/traceparent"

// traceparentKey is the gRPC metadata key the daemons' OpenTelemetry
// interceptors read the caller's trace context from (W3C Trace Context).
const traceparentKey = "traceparent"

// doc:begin trace
// WithTraceparent returns ctx with traceparent in its outgoing gRPC metadata,
// where the daemons' OpenTelemetry interceptors pick it up: the call joins that
// trace. An empty traceparent leaves ctx as it is, and so does a ctx that
// already carries one (a caller with OpenTelemetry of its own injected its
// current span, which is a better parent than the pod's first span).
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(traceparentKey)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, traceparentKey, traceparent)
}

// doc:end trace

// podSource is a pod as a request carries it: typed, or as its Kubernetes JSON,
// with the two fields the client itself reads from it.
type podSource struct {
	typed       *accountingv1.Pod
	json        []byte
	uid         string
	traceparent string
}

// podMeta is the part of a Kubernetes Pod's JSON the client reads.
type podMeta struct {
	Metadata struct {
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

// doc:begin pod
// PodJSON is what a call sends as kubernetes_pod_json: json.Marshal(pod) for a
// corev1.Pod, a *corev1.Pod or any value of that shape, which the daemons read
// as the Kubernetes API server writes a Pod. A []byte or json.RawMessage is
// taken as the pod's JSON already and sent as it is. A value json.Marshal
// refuses, or nil, is an INVALID_ARGUMENT error, like malformed JSON at the
// daemon: final, never retried.
func PodJSON(pod interface{}) ([]byte, error) {
	switch raw := pod.(type) {
	case nil:
		return nil, status.Error(codes.InvalidArgument, "hamiaccounting: pod: nil")
	case []byte:
		return raw, nil
	case json.RawMessage:
		return raw, nil
	}
	encoded, err := json.Marshal(pod)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "hamiaccounting: pod: %v", err)
	}
	return encoded, nil
}

// doc:end pod

// sourceOf is pod as a request's pod_source: a *accountingv1.Pod as the typed
// pod, anything else as its JSON (PodJSON). JSON the client cannot read the
// metadata of is still sent: the daemon names what is wrong with it.
func sourceOf(pod interface{}) (podSource, error) {
	if typed, ok := pod.(*accountingv1.Pod); ok {
		if typed == nil {
			return podSource{}, status.Error(codes.InvalidArgument, "hamiaccounting: pod: nil")
		}
		return podSource{typed: typed, uid: typed.GetUid(),
			traceparent: typed.GetAnnotations()[TraceparentAnnotation]}, nil
	}
	encoded, err := PodJSON(pod)
	if err != nil {
		return podSource{}, err
	}
	source := podSource{json: encoded}
	var meta podMeta
	if json.Unmarshal(encoded, &meta) == nil {
		source.uid = meta.Metadata.UID
		source.traceparent = meta.Metadata.Annotations[TraceparentAnnotation]
	}
	return source, nil
}
