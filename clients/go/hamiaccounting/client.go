package hamiaccounting

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	accountingv1 "github.com/hami-accounting/hami-accounting/clients/go/accountingv1"
)

// Client calls the three daemons as HAMi's scheduler process does: its
// webhook, extender and informer share one Client, so a quota check can ask to
// see at least what the informer has written.
//
// The generated stubs are exported for every other call (RegisterNode,
// SetQuota, Reserve, GetNodeUsage, WatchUsage, ...); on a connection from Dial
// they get the same deadlines and retries. A Client is safe for concurrent use.
type Client struct {
	Admission accountingv1.AdmissionClient
	Scheduler accountingv1.SchedulerClient
	Usage     accountingv1.UsageRecorderClient

	mu      sync.Mutex
	written int64
}

// NewClient makes a Client over connections to the admission, scheduler and
// usage daemons (from Dial). A nil connection leaves that stub nil, and the
// calls that need it answer FAILED_PRECONDITION: a webhook needs only the
// admission daemon.
func NewClient(admission, scheduler, usage grpc.ClientConnInterface) *Client {
	c := &Client{}
	if admission != nil {
		c.Admission = accountingv1.NewAdmissionClient(admission)
	}
	if scheduler != nil {
		c.Scheduler = accountingv1.NewSchedulerClient(scheduler)
	}
	if usage != nil {
		c.Usage = accountingv1.NewUsageRecorderClient(usage)
	}
	return c
}

// WrittenRevision is the newest recorder revision a write through this Client
// was answered with (0 before any).
func (c *Client) WrittenRevision() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

// NoteRevision records the revision a write made through c.Usage directly
// (SetQuota, RegisterNode, Reserve, ...) was answered with, so that the next
// CheckQuota reads it.
func (c *Client) NoteRevision(revision int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if revision > c.written {
		c.written = revision
	}
}

func missing(daemon string) error {
	return status.Errorf(codes.FailedPrecondition, "hamiaccounting: the Client has no %s connection", daemon)
}

// doc:begin webhook
// CheckQuota is what HAMi's mutating webhook asks before admitting a pod with a
// GPU request: does it fit its namespace's quota? The pod goes as its JSON (or
// typed, for a *accountingv1.Pod) on the pod's trace, with the newest revision
// this Client's writes were answered with, so the answer counts them. A "no" is
// an OK answer with Allowed false; see Verdict.
func (c *Client) CheckQuota(ctx context.Context, pod interface{}) (*accountingv1.CheckQuotaResponse, error) {
	if c.Admission == nil {
		return nil, missing("admission")
	}
	source, err := sourceOf(pod)
	if err != nil {
		return nil, err
	}
	request := &accountingv1.CheckQuotaRequest{MinUsageRevision: c.WrittenRevision()}
	if source.typed != nil {
		request.PodSource = &accountingv1.CheckQuotaRequest_Pod{Pod: source.typed}
	} else {
		request.PodSource = &accountingv1.CheckQuotaRequest_KubernetesPodJson{KubernetesPodJson: source.json}
	}
	return c.Admission.CheckQuota(WithTraceparent(ctx, source.traceparent), request)
}

// Verdict turns CheckQuota's answer into the webhook's allow or deny. Only an
// OK answer with Allowed admits the pod; every error denies (fail closed),
// with a message that says whether the pod or the check was at fault.
func Verdict(response *accountingv1.CheckQuotaResponse, err error) (allowed bool, message string) {
	switch status.Code(err) {
	case codes.OK:
		return response.GetAllowed(), response.GetMessage()
	case codes.InvalidArgument:
		return false, "GPU quota check rejected the pod: " + status.Convert(err).Message()
	default:
		return false, "GPU quota check unavailable, try again: " + status.Convert(err).Message()
	}
}

// doc:end webhook

// doc:begin extender
// Filter is the scheduler extender's filter verb: place the pod on one of
// kube-scheduler's candidate nodes. The placement is already reserved in the
// recorder when it returns; patch the returned annotations onto the pod. An
// empty NodeName (reason NoNodeFits, ReservationConflict, ...) is an answer,
// not an error: hand FailedNodes back to kube-scheduler.
func (c *Client) Filter(ctx context.Context, pod interface{}, nodeNames []string) (*accountingv1.FilterResponse, error) {
	if c.Scheduler == nil {
		return nil, missing("scheduler")
	}
	source, err := sourceOf(pod)
	if err != nil {
		return nil, err
	}
	request := &accountingv1.FilterRequest{NodeNames: nodeNames}
	if source.typed != nil {
		request.PodSource = &accountingv1.FilterRequest_Pod{Pod: source.typed}
	} else {
		request.PodSource = &accountingv1.FilterRequest_KubernetesPodJson{KubernetesPodJson: source.json}
	}
	return c.Scheduler.Filter(WithTraceparent(ctx, source.traceparent), request)
}

// doc:end extender

// doc:begin informer
// RecordPod runs on every add and update event of a pod that carries
// hami.io/vgpu-node. It is an idempotent upsert of the pod's current state:
// replaying an event changes nothing, so a resync or a retry is always safe.
func (c *Client) RecordPod(ctx context.Context, pod interface{}) (*accountingv1.RecordPodResponse, error) {
	if c.Usage == nil {
		return nil, missing("usage")
	}
	source, err := sourceOf(pod)
	if err != nil {
		return nil, err
	}
	request := &accountingv1.RecordPodRequest{}
	if source.typed != nil {
		request.PodSource = &accountingv1.RecordPodRequest_Pod{Pod: source.typed}
	} else {
		request.PodSource = &accountingv1.RecordPodRequest_KubernetesPodJson{KubernetesPodJson: source.json}
	}
	response, err := c.Usage.RecordPod(WithTraceparent(ctx, source.traceparent), request)
	c.NoteRevision(response.GetRevision())
	return response, err
}

// ForgetPod runs on the delete event (unwrap cache.DeletedFinalStateUnknown
// first): the recorder releases exactly what it stores for the pod, found by
// its metadata.uid (Found false when it never tracked it).
func (c *Client) ForgetPod(ctx context.Context, pod interface{}) (*accountingv1.ForgetPodResponse, error) {
	if c.Usage == nil {
		return nil, missing("usage")
	}
	source, err := sourceOf(pod)
	if err != nil {
		return nil, err
	}
	if source.uid == "" {
		return nil, status.Error(codes.InvalidArgument, "hamiaccounting: pod: metadata.uid is empty")
	}
	response, err := c.Usage.ForgetPod(WithTraceparent(ctx, source.traceparent),
		&accountingv1.ForgetPodRequest{PodUid: source.uid})
	c.NoteRevision(response.GetRevision())
	return response, err
}

// doc:end informer
