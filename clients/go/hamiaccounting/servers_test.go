package hamiaccounting

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	accountingv1 "github.com/hami-accounting/hami-accounting/clients/go/accountingv1"
)

// arrival is one call as a scripted server saw it.
type arrival struct {
	method       string
	traceparents []string
	deadline     time.Duration // time left when it arrived; 0: no deadline
	request      proto.Message
}

// blockAtMost is how long a blocked call waits for its caller to give up.
const blockAtMost = 10 * time.Second

// script answers the calls of the fake daemons below: the n-th call (1-based)
// answers answers[n-1] (OK past the end); a call listed in block waits until
// its caller gives up (blockAtMost at most); hook runs as each call arrives.
type script struct {
	answers []codes.Code
	block   map[int]bool
	hook    func(attempt int)
	reply   func(attempt int) int64 // the revision a write answers with

	mu    sync.Mutex
	calls []arrival
}

func (s *script) answer(ctx context.Context, method string, request proto.Message) (int, error) {
	seen := arrival{method: method, request: proto.Clone(request)}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		seen.traceparents = md.Get(traceparentKey)
	}
	if deadline, ok := ctx.Deadline(); ok {
		seen.deadline = time.Until(deadline)
	}
	s.mu.Lock()
	s.calls = append(s.calls, seen)
	attempt := len(s.calls)
	s.mu.Unlock()
	if s.hook != nil {
		s.hook(attempt)
	}
	if s.block[attempt] {
		// Bounded, so that a client that sets no deadline fails the test
		// instead of hanging it.
		select {
		case <-ctx.Done():
			return attempt, status.FromContextError(ctx.Err()).Err()
		case <-time.After(blockAtMost):
			return attempt, status.Errorf(codes.Aborted, "attempt %d had no deadline: blocked %v", attempt, blockAtMost)
		}
	}
	if attempt <= len(s.answers) && s.answers[attempt-1] != codes.OK {
		return attempt, status.Errorf(s.answers[attempt-1], "scripted answer to attempt %d", attempt)
	}
	return attempt, nil
}

func (s *script) arrivals() []arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]arrival(nil), s.calls...)
}

func (s *script) revision(attempt int) int64 {
	if s.reply == nil {
		return 0
	}
	return s.reply(attempt)
}

type fakeAdmission struct {
	accountingv1.UnimplementedAdmissionServer
	*script
}

func (f fakeAdmission) CheckQuota(ctx context.Context, in *accountingv1.CheckQuotaRequest) (*accountingv1.CheckQuotaResponse, error) {
	if _, err := f.answer(ctx, MethodCheckQuota, in); err != nil {
		return nil, err
	}
	return &accountingv1.CheckQuotaResponse{Allowed: true, Reason: "QuotaFits", Message: "fits"}, nil
}

type fakeScheduler struct {
	accountingv1.UnimplementedSchedulerServer
	*script
}

func (f fakeScheduler) Filter(ctx context.Context, in *accountingv1.FilterRequest) (*accountingv1.FilterResponse, error) {
	if _, err := f.answer(ctx, MethodFilter, in); err != nil {
		return nil, err
	}
	return &accountingv1.FilterResponse{NodeName: "node-1", Reason: "Scheduled"}, nil
}

type fakeUsage struct {
	accountingv1.UnimplementedUsageRecorderServer
	*script
}

func (f fakeUsage) RecordPod(ctx context.Context, in *accountingv1.RecordPodRequest) (*accountingv1.RecordPodResponse, error) {
	attempt, err := f.answer(ctx, MethodRecordPod, in)
	if err != nil {
		return nil, err
	}
	return &accountingv1.RecordPodResponse{Decision: "Recorded", Tracked: true, Revision: f.revision(attempt)}, nil
}

func (f fakeUsage) ForgetPod(ctx context.Context, in *accountingv1.ForgetPodRequest) (*accountingv1.ForgetPodResponse, error) {
	attempt, err := f.answer(ctx, MethodForgetPod, in)
	if err != nil {
		return nil, err
	}
	return &accountingv1.ForgetPodResponse{Found: true, Revision: f.revision(attempt)}, nil
}

func (f fakeUsage) GetNodeUsage(ctx context.Context, in *accountingv1.GetNodeUsageRequest) (*accountingv1.GetNodeUsageResponse, error) {
	if _, err := f.answer(ctx, MethodGetNodeUsage, in); err != nil {
		return nil, err
	}
	return &accountingv1.GetNodeUsageResponse{UnknownNodeNames: in.GetNodeNames()}, nil
}

// daemons is the three fake daemons on one real gRPC server on 127.0.0.1.
type daemons struct {
	address string
	script  *script
}

func serveFakes(t *testing.T, s *script, options ...grpc.ServerOption) daemons {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer(options...)
	accountingv1.RegisterAdmissionServer(server, fakeAdmission{script: s})
	accountingv1.RegisterSchedulerServer(server, fakeScheduler{script: s})
	accountingv1.RegisterUsageRecorderServer(server, fakeUsage{script: s})
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return daemons{address: listener.Addr().String(), script: s}
}

// client dials the fakes (plaintext unless options say otherwise) and makes a
// Client over the one connection.
func (d daemons) client(t *testing.T, options ...Option) *Client {
	t.Helper()
	conn, err := Dial(context.Background(), d.address, options...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return NewClient(conn, conn, conn)
}
