package hamiaccounting

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	accountingv1 "github.com/hami-accounting/hami-accounting/clients/go/accountingv1"
)

// A pod shaped like corev1.Pod (k8s.io/api is not packaged in Debian): the
// client takes whatever the caller holds and sends json.Marshal of it.
type objectMeta struct {
	Name        string            `json:"name,omitempty"`
	UID         string            `json:"uid,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type kubePod struct {
	Metadata objectMeta      `json:"metadata"`
	Spec     json.RawMessage `json:"spec"`
}

const (
	podTrace    = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	callerTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

func tracedPod() kubePod {
	return kubePod{
		Metadata: objectMeta{Name: "llm-server", UID: "c2a5e002", Annotations: map[string]string{TraceparentAnnotation: podTrace}},
		Spec:     json.RawMessage(`{"containers":[{"name":"server"}]}`),
	}
}

func sentPodJSON(t *testing.T, request interface{}) []byte {
	t.Helper()
	switch r := request.(type) {
	case *accountingv1.CheckQuotaRequest:
		return r.GetKubernetesPodJson()
	case *accountingv1.FilterRequest:
		return r.GetKubernetesPodJson()
	case *accountingv1.RecordPodRequest:
		return r.GetKubernetesPodJson()
	}
	t.Fatalf("no pod JSON in %T", request)
	return nil
}

func TestThePodGoesAsJSONMarshalOfWhatTheCallerHolds(t *testing.T) {
	pod := tracedPod()
	want, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		pod  interface{}
	}{
		{"a value of corev1.Pod's shape", pod},
		{"a pointer to it", &pod},
		{"its JSON as []byte, sent as it is", want},
		{"its JSON as json.RawMessage", json.RawMessage(want)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fakes := serveFakes(t, &script{})
			client := fakes.client(t)
			ctx := context.Background()
			if _, err := client.CheckQuota(ctx, tc.pod); err != nil {
				t.Fatal(err)
			}
			if _, err := client.Filter(ctx, tc.pod, []string{"node-1"}); err != nil {
				t.Fatal(err)
			}
			if _, err := client.RecordPod(ctx, tc.pod); err != nil {
				t.Fatal(err)
			}
			if _, err := client.ForgetPod(ctx, tc.pod); err != nil {
				t.Fatal(err)
			}
			arrivals := fakes.script.arrivals()
			if len(arrivals) != 4 {
				t.Fatalf("%d calls arrived, want 4", len(arrivals))
			}
			for _, seen := range arrivals[:3] {
				if got := sentPodJSON(t, seen.request); !bytes.Equal(got, want) {
					t.Errorf("%s sent %s, want json.Marshal(pod) = %s", seen.method, got, want)
				}
			}
			if got := arrivals[3].request.(*accountingv1.ForgetPodRequest).GetPodUid(); got != "c2a5e002" {
				t.Errorf("ForgetPod sent pod_uid %q, want the pod's metadata.uid", got)
			}
		})
	}
}

func TestATypedPodGoesTyped(t *testing.T) {
	fakes := serveFakes(t, &script{})
	typed := &accountingv1.Pod{Uid: "u-typed", Namespace: "team-a", Annotations: map[string]string{TraceparentAnnotation: podTrace}}
	if _, err := fakes.client(t).Filter(context.Background(), typed, []string{"node-1"}); err != nil {
		t.Fatal(err)
	}
	seen := fakes.script.arrivals()[0]
	if got := seen.request.(*accountingv1.FilterRequest).GetPod().GetUid(); got != "u-typed" {
		t.Fatalf("Filter sent typed pod uid %q, want u-typed", got)
	}
	if len(seen.traceparents) != 1 || seen.traceparents[0] != podTrace {
		t.Fatalf("traceparent metadata %v, want the typed pod's annotation", seen.traceparents)
	}
}

func TestAPodThatCannotBeSentIsInvalidArgumentAndNeverCalls(t *testing.T) {
	cases := []struct {
		name    string
		pod     interface{}
		call    func(*Client, interface{}) error
		message string
	}{
		{"nil", nil, func(c *Client, p interface{}) error { _, err := c.CheckQuota(context.Background(), p); return err }, "pod: nil"},
		{"a typed nil", (*accountingv1.Pod)(nil), func(c *Client, p interface{}) error { _, err := c.Filter(context.Background(), p, nil); return err }, "pod: nil"},
		{"a value json.Marshal refuses", map[string]interface{}{"metadata": make(chan int)}, func(c *Client, p interface{}) error { _, err := c.RecordPod(context.Background(), p); return err }, "pod: json: unsupported type"},
		{"ForgetPod without metadata.uid", kubePod{Metadata: objectMeta{Name: "no-uid"}}, func(c *Client, p interface{}) error { _, err := c.ForgetPod(context.Background(), p); return err }, "metadata.uid is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fakes := serveFakes(t, &script{})
			err := tc.call(fakes.client(t), tc.pod)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.message) {
				t.Fatalf("got %v, want INVALID_ARGUMENT naming %q", err, tc.message)
			}
			if n := len(fakes.script.arrivals()); n != 0 {
				t.Fatalf("%d calls reached the daemon, want none", n)
			}
		})
	}
}

func TestTraceparentTravelsAsMetadata(t *testing.T) {
	untraced := tracedPod()
	untraced.Metadata.Annotations = nil
	cases := []struct {
		name string
		ctx  context.Context
		pod  interface{}
		want []string
	}{
		{"the pod's hami.io/traceparent annotation", context.Background(), tracedPod(), []string{podTrace}},
		{"no annotation, no metadata", context.Background(), untraced, nil},
		{"the caller's own span wins over the pod's", metadata.AppendToOutgoingContext(context.Background(), "traceparent", callerTrace), tracedPod(), []string{callerTrace}},
		{"JSON the client cannot read still goes, untraced", context.Background(), []byte(`{"metadata":`), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fakes := serveFakes(t, &script{})
			if _, err := fakes.client(t).CheckQuota(tc.ctx, tc.pod); err != nil {
				t.Fatal(err)
			}
			got := fakes.script.arrivals()[0].traceparents
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("traceparent metadata %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWithTraceparentAddsOnlyWhatIsMissing(t *testing.T) {
	cases := []struct {
		name        string
		ctx         context.Context
		traceparent string
		want        []string
	}{
		{"added", context.Background(), podTrace, []string{podTrace}},
		{"empty adds nothing", context.Background(), "", nil},
		{"one already there stays alone", metadata.NewOutgoingContext(context.Background(), metadata.Pairs("traceparent", callerTrace)), podTrace, []string{callerTrace}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			md, _ := metadata.FromOutgoingContext(WithTraceparent(tc.ctx, tc.traceparent))
			if got := md.Get("traceparent"); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("outgoing traceparent %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCheckQuotaReadsTheClientsOwnWrites(t *testing.T) {
	revisions := map[int]int64{1: 7, 2: 5}
	fakes := serveFakes(t, &script{reply: func(attempt int) int64 { return revisions[attempt] }})
	client := fakes.client(t)
	ctx := context.Background()
	pod := tracedPod()
	if _, err := client.RecordPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ForgetPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	client.NoteRevision(6) // an older write made through client.Usage directly
	if got := client.WrittenRevision(); got != 7 {
		t.Fatalf("WrittenRevision %d, want the newest answer 7", got)
	}
	if _, err := client.CheckQuota(ctx, pod); err != nil {
		t.Fatal(err)
	}
	sent := fakes.script.arrivals()[2].request.(*accountingv1.CheckQuotaRequest)
	if sent.GetMinUsageRevision() != 7 {
		t.Fatalf("CheckQuota sent min_usage_revision %d, want 7", sent.GetMinUsageRevision())
	}
}

func TestVerdictFailsClosed(t *testing.T) {
	cases := []struct {
		name     string
		response *accountingv1.CheckQuotaResponse
		err      error
		allowed  bool
		message  string
	}{
		{"fits", &accountingv1.CheckQuotaResponse{Allowed: true, Message: "fits"}, nil, true, "fits"},
		{"over quota is an OK no", &accountingv1.CheckQuotaResponse{Message: "30720 > 24576"}, nil, false, "30720 > 24576"},
		{"a bad pod is denied, saying so", nil, status.Error(codes.InvalidArgument, "spec: missing"), false, "rejected the pod: spec: missing"},
		{"an unreachable daemon denies", nil, status.Error(codes.Unavailable, "down"), false, "unavailable, try again: down"},
		{"a slow daemon denies", nil, status.Error(codes.DeadlineExceeded, "slow"), false, "unavailable, try again: slow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			allowed, message := Verdict(tc.response, tc.err)
			if allowed != tc.allowed || !strings.Contains(message, tc.message) {
				t.Fatalf("Verdict = (%v, %q), want (%v, ...%q...)", allowed, message, tc.allowed, tc.message)
			}
		})
	}
}

func TestAClientWithoutAConnectionSaysWhich(t *testing.T) {
	client := NewClient(nil, nil, nil)
	ctx := context.Background()
	pod := tracedPod()
	_, checkErr := client.CheckQuota(ctx, pod)
	_, filterErr := client.Filter(ctx, pod, nil)
	_, recordErr := client.RecordPod(ctx, pod)
	_, forgetErr := client.ForgetPod(ctx, pod)
	cases := []struct {
		call, daemon string
		err          error
	}{
		{"CheckQuota", "admission", checkErr},
		{"Filter", "scheduler", filterErr},
		{"RecordPod", "usage", recordErr},
		{"ForgetPod", "usage", forgetErr},
	}
	for _, tc := range cases {
		if status.Code(tc.err) != codes.FailedPrecondition || !strings.Contains(tc.err.Error(), tc.daemon) {
			t.Errorf("%s: got %v, want FAILED_PRECONDITION naming the %s connection", tc.call, tc.err, tc.daemon)
		}
	}

}
