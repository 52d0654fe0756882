// Command hamiclient calls the three hami-accounting daemons the way HAMi's Go
// components do (webhook → Admission.CheckQuota, scheduler extender →
// Scheduler.Filter, pod informer → UsageRecorder.RecordPod/ForgetPod), walks
// the init-container seed cases 1–4 and prints every figure as one JSON
// document on stdout. tests/interop/test_go_client.py builds and runs it.
// With -mode extender it is kube-scheduler instead, calling the scheduler
// daemon's extender endpoint over HTTP(S) (extender.go,
// tests/interop/test_go_extender.py).
//
// Every call goes through the client package of the Go module in clients/go
// (hamiaccounting: the dial, deadlines, retries and traceparent HAMi would
// use). The regions between "doc:begin NAME" and "doc:end NAME" here and in
// that package are quoted verbatim in docs/go-clients.md;
// tests/interop/test_go_docs.py keeps them identical.
//
// Built in GOPATH mode against Debian's grpc-go 1.33: see
// scripts/build_go_client.py.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	accountingv1 "github.com/hami-accounting/hami-accounting/clients/go/accountingv1"
	"github.com/hami-accounting/hami-accounting/clients/go/hamiaccounting"
)

// Seed figures (docs/design.md §9, the design cases): one 24 GiB GPU per node
// and a 24 GiB namespace quota on device memory.
const (
	gpuMemoryMiB       = 24576
	gpuSplitCount      = 10
	quotaGPUMemKey     = "limits.nvidia.com/gpumem"
	namespaceDefault   = "team-a"
	node1              = "node-1"
	node2              = "node-2"
	nodeMissing        = "node-missing"
	node1GPU           = "GPU-seed-0"
	node2GPU           = "GPU-seed-1"
	gpuModel           = "NVIDIA A10"
	firstEventDeadline = 2 * time.Second
)

// Fixed pod UIDs so the daemons' logs can be matched to the scenario.
const (
	uidCase1       = "c1a5e001-6f1c-4c2e-9d0a-000000000001"
	uidCase2       = "c2a5e002-6f1c-4c2e-9d0a-000000000002"
	uidNewcomer    = "c4a5e004-6f1c-4c2e-9d0a-000000000004"
	uidProbe       = "c5a5e005-6f1c-4c2e-9d0a-000000000005"
	uidMalformed   = "c6a5e006-6f1c-4c2e-9d0a-000000000006"
	uidUnreachable = "c7a5e007-6f1c-4c2e-9d0a-000000000007"
	uidMIG         = "c8a5e008-6f1c-4c2e-9d0a-000000000008"
)

const (
	nodeMIG = "node-mig"
	// migRegister is HAMi's own MIG-mode registration (its nvidia device_test.go:2472).
	migRegister = `[{"id":"GPU-mig-0","count":7,"devmem":40960,"devcore":100,` +
		`"type":"NVIDIA-A100-SXM4-40GB","numa":0,"health":true,"mode":"mig","migProfiles":` +
		`[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,"placements":[{"start":6,"size":1}]}]}]`
	annotationMIGAllocations = "hami.io/vgpu-mig-allocations"
)

type config struct {
	admissionAddr   string
	schedulerAddr   string
	usageAddr       string
	unreachableAddr string
	namespace       string
	watchTimeout    time.Duration
	tlsCert         string
	tlsKey          string
	tlsCA           string
	tlsServerName   string
}

// step is one call's figures in the JSON report.
type step map[string]interface{}

type report struct {
	OK               bool              `json:"ok"`
	UnexpectedErrors []string          `json:"unexpected_errors"`
	Addresses        map[string]string `json:"addresses"`
	Steps            []step            `json:"steps"`
}

// add records a call that should have succeeded.
func (r *report) add(name string, err error, fields step) step {
	return r.record(name, err, fields, false)
}

// addExpectingError records a call that is meant to fail (malformed input, a
// dead address): its code is reported, not counted as unexpected.
func (r *report) addExpectingError(name string, err error, fields step) step {
	return r.record(name, err, fields, true)
}

func (r *report) record(name string, err error, fields step, errorExpected bool) step {
	if fields == nil {
		fields = step{}
	}
	fields["step"] = name
	fields["code"] = status.Code(err).String()
	if err != nil {
		fields["error"] = status.Convert(err).Message()
		if !errorExpected {
			r.UnexpectedErrors = append(r.UnexpectedErrors, fmt.Sprintf("%s: %s", name, status.Code(err)))
		}
	} else if errorExpected {
		r.UnexpectedErrors = append(r.UnexpectedErrors, name+": expected an error, got OK")
	}
	r.Steps = append(r.Steps, fields)
	return fields
}

func main() {
	cfg := config{}
	flag.StringVar(&cfg.admissionAddr, "admission-addr", "127.0.0.1:50051", "Admission daemon address")
	flag.StringVar(&cfg.schedulerAddr, "scheduler-addr", "127.0.0.1:50052", "Scheduler daemon address")
	flag.StringVar(&cfg.usageAddr, "usage-addr", "127.0.0.1:50053", "UsageRecorder daemon address")
	flag.StringVar(&cfg.unreachableAddr, "unreachable-addr", "",
		"an address nothing listens on: CheckQuota there must end UNAVAILABLE and deny (skipped when empty)")
	flag.StringVar(&cfg.namespace, "namespace", namespaceDefault, "namespace of the seed pods")
	flag.DurationVar(&cfg.watchTimeout, "watch-timeout", 10*time.Second, "deadline of the WatchUsage stream")
	flag.StringVar(&cfg.tlsCA, "tls-ca", "", "PEM CA bundle that signed the daemons' certificates (empty: plaintext)")
	flag.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM client certificate, for daemons that run mutual TLS")
	flag.StringVar(&cfg.tlsKey, "tls-key", "", "its PEM private key")
	flag.StringVar(&cfg.tlsServerName, "tls-server-name", "", "name the daemons' certificates carry (empty: the dialled host)")
	mode := flag.String("mode", "daemons", "daemons: the gRPC seed cases; extender: kube-scheduler's HTTP extender calls (extender.go)")
	ext := extenderConfig{}
	flag.StringVar(&ext.extenderURL, "extender-url", "", "urlPrefix of the scheduler daemon's extender endpoint (-mode extender)")
	flag.StringVar(&ext.kubeAPIURL, "kube-api-url", "", "Kubernetes API the pods are created on (-mode extender)")
	flag.StringVar(&ext.namespace, "extender-namespace", namespaceDefault, "namespace of the extender's pods")
	flag.StringVar(&ext.quotaNamespace, "quota-namespace", "team-q", "namespace whose quota refuses the extender's quota pod")
	flag.DurationVar(&ext.httpTimeout, "http-timeout", defaultExtenderHTTPTimeout, "the extender's httpTimeout")
	flag.Parse()

	var result *report
	switch *mode {
	case "daemons":
		result = run(cfg)
	case "extender":
		result = runExtender(cfg, ext)
	default:
		fmt.Fprintf(os.Stderr, "hamiclient: -mode %q: daemons or extender\n", *mode)
		os.Exit(2)
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	if err := encoder.Encode(result); err != nil {
		fmt.Fprintln(os.Stderr, "hamiclient: cannot encode the report:", err)
		os.Exit(2)
	}
	if !result.OK {
		os.Exit(1)
	}
}

// doc:begin connect
// dialOptions are the Dial options of every daemon: TLS from the PEM files the
// daemons' own HAMI_ACCOUNTING_TLS_* variables name, plaintext without them.
func dialOptions(cfg config) ([]hamiaccounting.Option, error) {
	if cfg.tlsCA == "" && cfg.tlsCert == "" {
		return nil, nil
	}
	tlsConfig, err := hamiaccounting.LoadTLSConfig(cfg.tlsCert, cfg.tlsKey, cfg.tlsCA, cfg.tlsServerName)
	if err != nil {
		return nil, err
	}
	return []hamiaccounting.Option{hamiaccounting.WithTLS(tlsConfig)}, nil
}

// doc:end connect

// serving asks grpc.health.v1 whether the daemon serves (service "" is the
// whole server; a service name such as hami.accounting.v1.UsageRecorder works
// too). The connection's call policy gives it its deadline.
func serving(conn *grpc.ClientConn, service string) (string, error) {
	response, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	return response.GetStatus().String(), err
}

// attempts counts the attempts the call policy makes on one connection (an
// interceptor given through WithDialOptions runs once per attempt), so the
// report shows what was retried and what was not.
type attempts struct{ count int64 }

func (a *attempts) option() hamiaccounting.Option {
	return hamiaccounting.WithDialOptions(grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, request, reply interface{}, conn *grpc.ClientConn,
			invoke grpc.UnaryInvoker, options ...grpc.CallOption) error {
			atomic.AddInt64(&a.count, 1)
			return invoke(ctx, method, request, reply, conn, options...)
		}))
}

func (a *attempts) get() int64 { return atomic.LoadInt64(&a.count) }

// clients is the package's Client and the attempts made on each daemon.
type clients struct {
	*hamiaccounting.Client
	attempts map[string]*attempts
}

// run walks the scenario. A failed step is reported and the walk goes on, so
// one JSON document always shows every figure that could be had.
func run(cfg config) *report {
	out := &report{
		UnexpectedErrors: []string{},
		Addresses: map[string]string{
			"admission": cfg.admissionAddr, "scheduler": cfg.schedulerAddr, "usage": cfg.usageAddr,
		},
		Steps: []step{},
	}
	defer func() { out.OK = len(out.UnexpectedErrors) == 0 }()

	options, err := dialOptions(cfg)
	if err != nil {
		out.add("tls_config", status.Error(codes.InvalidArgument, err.Error()), nil)
		return out
	}
	c := clients{attempts: map[string]*attempts{}}
	conns := map[string]*grpc.ClientConn{}
	for _, daemon := range []struct{ name, address, service string }{
		{"admission", cfg.admissionAddr, "hami.accounting.v1.Admission"},
		{"scheduler", cfg.schedulerAddr, "hami.accounting.v1.Scheduler"},
		{"usage", cfg.usageAddr, "hami.accounting.v1.UsageRecorder"},
	} {
		c.attempts[daemon.name] = &attempts{}
		conn, err := hamiaccounting.Dial(context.Background(), daemon.address,
			append(options, c.attempts[daemon.name].option())...)
		if err != nil {
			out.add("dial_"+daemon.name, err, step{"address": daemon.address})
			return out
		}
		defer conn.Close()
		conns[daemon.name] = conn
		overall, err := serving(conn, "")
		fields := step{"daemon": daemon.name, "address": daemon.address, "status": overall, "tls": len(options) > 0}
		out.add("health_"+daemon.name, err, fields)
		// The per-service status is reported but not required.
		perService, serviceErr := serving(conn, daemon.service)
		fields["service"] = daemon.service
		fields["service_status"] = perService
		fields["service_code"] = status.Code(serviceErr).String()
	}
	// doc:begin client
	// One Client for the webhook, the extender and the informer of one process:
	// its quota checks count what its informer wrote.
	c.Client = hamiaccounting.NewClient(conns["admission"], conns["scheduler"], conns["usage"])
	// doc:end client

	registerNodes(cfg, c, out)
	setQuota(cfg, c, out)

	// Case 1: init 30720 + app 4096 → effective 30720 > 24576: denied.
	case1 := newPod(cfg.namespace, "llm-convert-too-big", uidCase1,
		[]kubeContainer{gpuContainer("convert-weights", containerImageInit, 30720)},
		[]kubeContainer{gpuContainer("server", containerImageServer, 4096)})
	checkQuota(c, out, "case1_check_quota", case1)

	// Case 2: init 20480 + app 10240 → effective 20480 ≤ 24576: allowed, and
	// the pod keeps the returned traceparent in its annotation.
	case2 := newPod(cfg.namespace, "llm-server", uidCase2,
		[]kubeContainer{gpuContainer("convert-weights", containerImageInit, 20480)},
		[]kubeContainer{gpuContainer("server", containerImageServer, 10240)})
	case2Check := checkQuota(c, out, "case2_check_quota", case2)
	if traceparent := case2Check.GetTraceparent(); traceparent != "" {
		case2.Metadata.Annotations[annotationTraceparent] = traceparent
	}

	// Case 2 placed: Filter with the typed Pod; one node does not exist.
	chosen := filter(c, out, "case2_filter", case2, typedSource, []string{node1, node2, nodeMissing})
	bound := bindPod(case2, chosen)

	// Case 3: the informer records the bound pod while its init container runs.
	bound.Status = podStatus{
		Phase:                 podPhasePending,
		InitContainerStatuses: []containerStatus{runningStatus("convert-weights", containerImageInit)},
		ContainerStatuses:     []containerStatus{waitingStatus("server", containerImageServer, "PodInitializing")},
	}
	recordPod(c, out, "case3_record_pod", bound)
	recordPod(c, out, "case3_record_pod_replayed", bound)
	nodeUsage(c, out, "case3_node_usage", []string{chosen.GetNodeName(), nodeMissing})
	namespaceUsage(cfg, c, out, "case3_namespace_usage")

	// Case 4, before the shrink: a 12288 pod does not fit (20480 + 12288 > 24576).
	newcomer := newPod(cfg.namespace, "llm-server-2", uidNewcomer, nil,
		[]kubeContainer{gpuContainer("server", containerImageServer, 12288)})
	checkQuota(c, out, "case4_check_quota_before_shrink", newcomer)

	// Case 4: convert-weights Terminated with exit code 0 → stored shrinks to 10240.
	bound.Status = podStatus{
		Phase:                 podPhaseRunning,
		InitContainerStatuses: []containerStatus{completedStatus("convert-weights", containerImageInit, 0)},
		ContainerStatuses:     []containerStatus{runningStatus("server", containerImageServer)},
	}
	recordPod(c, out, "case4_record_pod", bound)
	nodeUsage(c, out, "case4_node_usage", []string{chosen.GetNodeName()})
	namespaceUsage(cfg, c, out, "case4_namespace_usage")

	// Case 4, after the shrink: 10240 + 12288 ≤ 24576, and it fits on the same GPU.
	newcomerCheck := checkQuota(c, out, "case4_check_quota_after_shrink", newcomer)
	if traceparent := newcomerCheck.GetTraceparent(); traceparent != "" {
		newcomer.Metadata.Annotations[annotationTraceparent] = traceparent
	}
	filter(c, out, "case4_filter_newcomer", newcomer, jsonSource, []string{chosen.GetNodeName()})

	// Reserve directly: 4096 more on that GPU does not fit (22528 + 4096 >
	// 24576); exactly 2048 more fills the card and the quota to the MiB.
	gpu := chosen.GetReserved()
	probeUUID := ""
	if len(gpu) > 0 {
		probeUUID = gpu[0].GetUuid()
	}
	probe := newPod(cfg.namespace, "reserve-probe", uidProbe, nil,
		[]kubeContainer{gpuContainer("probe", containerImageServer, 4096)})
	reserve(c, out, "reserve_over_capacity", probe, chosen.GetNodeName(), probeUUID, 4096)
	probe.Spec.Containers = []kubeContainer{gpuContainer("probe", containerImageServer, 2048)}
	reserve(c, out, "reserve_exact_fit", probe, chosen.GetNodeName(), probeUUID, 2048)
	namespaceUsage(cfg, c, out, "full_namespace_usage")

	podUsage(c, out, "case4_pod_usage", bound)

	// Watch the recorder while the informer forgets the three pods.
	watch := startWatch(cfg, c)
	forgetPod(c, out, "forget_probe", probe)
	forgetPod(c, out, "forget_newcomer", newcomer)
	forgetPod(c, out, "forget_case2", bound)
	watch.finish(out, uidCase2)
	namespaceUsage(cfg, c, out, "final_namespace_usage")
	nodeUsage(c, out, "final_node_usage", []string{node1, node2})

	malformed(c, out)
	migCard(cfg, c, out)
	if cfg.unreachableAddr != "" {
		unreachable(cfg, out)
	}
	return out
}

// migCard registers a card in MIG mode, places a pod on it and releases it: the
// grant names its instance, the annotations carry what HAMi's device plugin
// reads, and the card's placements show it held, then free.
func migCard(cfg config, c clients, out *report) {
	nodeJSON, err := json.Marshal(kubeNode{
		Metadata: objectMeta{Name: nodeMIG, Annotations: map[string]string{annotationNodeRegister: migRegister}},
	})
	if err != nil {
		panic(err)
	}
	registered, err := c.Usage.RegisterNode(context.Background(), &accountingv1.RegisterNodeRequest{
		NodeSource: &accountingv1.RegisterNodeRequest_KubernetesNodeJson{KubernetesNodeJson: nodeJSON},
	})
	c.NoteRevision(registered.GetRevision())
	profiles := []step{}
	for _, device := range registered.GetNode().GetDevices() {
		for _, profile := range device.GetMigProfiles() {
			profiles = append(profiles, step{
				"name": profile.GetName(), "memory_mib": profile.GetMemoryMib(),
				"core_percent": profile.GetCorePercent(), "placements": len(profile.GetPlacements()),
			})
		}
	}
	out.add("mig_register_node", err, step{"mig_profiles": profiles})

	pod := newPod(cfg.namespace, "mig-worker", uidMIG, nil,
		[]kubeContainer{gpuContainer("worker", containerImageServer, 3000)})
	filtered := filter(c, out, "mig_filter", pod, typedSource, []string{nodeMIG})
	instances := []step{}
	for _, ctr := range filtered.GetContainerGrants() {
		for _, grant := range ctr.GetGrants() {
			if mig := grant.GetMig(); mig != nil {
				instances = append(instances, step{
					"uuid": grant.GetUuid(), "profile": mig.GetProfile(),
					"start": mig.GetPlacement().GetStart(), "size": mig.GetPlacement().GetSize(),
				})
			}
		}
	}
	held := func() []step {
		response, err := c.Usage.GetNodeUsage(context.Background(), &accountingv1.GetNodeUsageRequest{NodeNames: []string{nodeMIG}})
		placements := []step{}
		if err == nil {
			for _, node := range response.GetNodes() {
				for _, device := range node.GetDevices() {
					for _, p := range device.GetMigInUse() {
						placements = append(placements, step{"start": p.GetStart(), "size": p.GetSize()})
					}
				}
			}
		}
		return placements
	}
	out.add("mig_instances", nil, step{
		"instances":       instances,
		"mig_allocations": filtered.GetAnnotations()[annotationMIGAllocations],
		"mig_in_use":      held(),
	})
	forgetPod(c, out, "mig_forget", pod)
	out.add("mig_released", nil, step{"mig_in_use": held()})
}

// registerNodes registers node-1 from its Kubernetes Node JSON (the device
// plugin's hami.io/node-nvidia-register annotation) and node-2 from a typed
// inventory.
func registerNodes(cfg config, c clients, out *report) {
	register, err := json.Marshal([]deviceInfo{{
		ID: node1GPU, Count: gpuSplitCount, Devmem: gpuMemoryMiB, Devcore: 100,
		Type: gpuModel, Mode: "hami-core", Health: true,
	}})
	if err != nil {
		panic(err)
	}
	node := kubeNode{
		Metadata: objectMeta{Name: node1, Annotations: map[string]string{annotationNodeRegister: string(register)}},
		Status: nodeStatus{
			Capacity:    map[string]string{resourceGPUCount: "10"},
			Allocatable: map[string]string{resourceGPUCount: "10"},
		},
	}
	nodeJSON, err := json.Marshal(node)
	if err != nil {
		panic(err)
	}
	response, err := c.Usage.RegisterNode(context.Background(), &accountingv1.RegisterNodeRequest{
		NodeSource: &accountingv1.RegisterNodeRequest_KubernetesNodeJson{KubernetesNodeJson: nodeJSON},
	})
	c.NoteRevision(response.GetRevision())
	out.add("register_node_json", err, step{
		"node_register_annotation": string(register),
		"node":                     nodeUsageFields(response.GetNode()),
	})

	response, err = c.Usage.RegisterNode(context.Background(), &accountingv1.RegisterNodeRequest{
		NodeName: node2,
		NodeSource: &accountingv1.RegisterNodeRequest_Inventory{Inventory: &accountingv1.NodeInventory{
			Devices: []*accountingv1.Device{{
				Uuid: node2GPU, DeviceType: gpuModel, Index: 0, SlotsTotal: gpuSplitCount,
				MemoryTotalMib: gpuMemoryMiB, CoresTotal: 100, Mode: "hami-core", Healthy: true,
				Vendor: vendorNVIDIA,
			}},
		}},
	})
	c.NoteRevision(response.GetRevision())
	out.add("register_node_inventory", err, step{"node": nodeUsageFields(response.GetNode())})
}

func setQuota(cfg config, c clients, out *report) {
	response, err := c.Usage.SetQuota(context.Background(), &accountingv1.SetQuotaRequest{
		Namespace: cfg.namespace,
		Limits:    map[string]int64{quotaGPUMemKey: gpuMemoryMiB},
	})
	c.NoteRevision(response.GetRevision())
	out.add("set_quota", err, step{
		"namespace": cfg.namespace,
		"limits":    map[string]int64{quotaGPUMemKey: gpuMemoryMiB},
		"items":     quotaItemFields(response.GetItems()),
	})
}

func checkQuota(c clients, out *report, name string, pod *kubePod) *accountingv1.CheckQuotaResponse {
	minUsageRevision := c.WrittenRevision()
	// doc:begin webhook-call
	// The webhook's whole quota decision: the pod as the AdmissionReview holds
	// it, allowed only on an OK answer that says so.
	response, err := c.CheckQuota(context.Background(), pod)
	allowed, message := hamiaccounting.Verdict(response, err)
	// doc:end webhook-call
	var effective []step
	for _, vendor := range response.GetEffective() {
		effective = append(effective, step{
			"vendor": vendor.GetVendor(), "count": vendor.GetCount(), "memory_mib": vendor.GetMemoryMib(),
			"core_percent": vendor.GetCorePercent(), "memory_sized_at_scheduling": vendor.GetMemorySizedAtScheduling(),
		})
	}
	var items []step
	for _, item := range response.GetItems() {
		items = append(items, step{
			"resource": item.GetResource(), "requested": item.GetRequested(), "used": item.GetUsed(),
			"limit": item.GetLimit(), "limit_set": item.GetLimitSet(), "exceeded": item.GetExceeded(),
			"enforced": item.GetEnforced(),
		})
	}
	out.add(name, err, step{
		"pod_uid":            pod.Metadata.UID,
		"allowed":            response.GetAllowed(),
		"reason":             response.GetReason(),
		"message":            response.GetMessage(),
		"traceparent":        response.GetTraceparent(),
		"namespace":          response.GetNamespace(),
		"effective":          effective,
		"items":              items,
		"webhook_allowed":    allowed,
		"webhook_message":    message,
		"min_usage_revision": minUsageRevision,
	})
	return response
}

// How filter sends the pod: the typed Pod message, or the pod's JSON.
const (
	typedSource = "typed"
	jsonSource  = "kubernetes_pod_json"
)

func filter(c clients, out *report, name string, pod *kubePod, source string, nodeNames []string) *accountingv1.FilterResponse {
	var sent interface{} = pod
	if source == typedSource {
		typed, err := typedPod(pod)
		if err != nil {
			out.add(name, status.Error(codes.InvalidArgument, err.Error()), nil)
			return nil
		}
		sent = typed
	}
	response, err := c.Filter(context.Background(), sent, nodeNames)
	var scores []step
	for _, score := range response.GetScores() {
		scores = append(scores, step{"node_name": score.GetNodeName(), "score": score.GetScore()})
	}
	out.add(name, err, step{
		"pod_uid":              pod.Metadata.UID,
		"pod_source":           source,
		"traceparent_sent":     pod.Metadata.Annotations[annotationTraceparent],
		"node_names":           nodeNames,
		"node_name":            response.GetNodeName(),
		"annotations":          response.GetAnnotations(),
		"failed_nodes":         response.GetFailedNodes(),
		"container_grants":     containerGrantFields(response.GetContainerGrants()),
		"scores":               scores,
		"reason":               response.GetReason(),
		"message":              response.GetMessage(),
		"reserved":             usageFields(response.GetReserved()),
		"reserved_memory_mib":  memoryMiB(response.GetReserved()),
		"devices_allocated":    response.GetAnnotations()[annotationDevicesAllocated],
		"devices_to_allocate":  response.GetAnnotations()[annotationDevicesToAlloc],
		"vgpu_node_annotation": response.GetAnnotations()[annotationVGPUNode],
		"failed_node_names":    sortedKeys(response.GetFailedNodes()),
	})
	return response
}

// bindPod is the pod as the informer sees it after the extender patched the
// Filter annotations onto it and the device plugin allocated.
func bindPod(pod *kubePod, filtered *accountingv1.FilterResponse) *kubePod {
	// doc:begin extender-patch
	bound := clonePod(pod)
	for key, value := range filtered.GetAnnotations() {
		bound.Metadata.Annotations[key] = value
	}
	bound.Spec.NodeName = filtered.GetNodeName()
	// doc:end extender-patch
	bound.Metadata.Annotations[annotationBindPhase] = "success"
	if bound.Metadata.Annotations[annotationVGPUNode] == "" {
		bound.Metadata.Annotations[annotationVGPUNode] = filtered.GetNodeName()
	}
	return bound
}

func recordPod(c clients, out *report, name string, pod *kubePod) {
	response, err := c.RecordPod(context.Background(), pod)
	out.add(name, err, step{
		"pod_uid":           pod.Metadata.UID,
		"phase":             pod.Status.Phase,
		"decision":          response.GetDecision(),
		"message":           response.GetMessage(),
		"tracked":           response.GetTracked(),
		"init_released":     response.GetInitReleased(),
		"stored":            usageFields(response.GetStored()),
		"stored_memory_mib": memoryMiB(response.GetStored()),
		"traceparent_sent":  pod.Metadata.Annotations[annotationTraceparent],
	})
}

func forgetPod(c clients, out *report, name string, pod *kubePod) {
	response, err := c.ForgetPod(context.Background(), pod)
	out.add(name, err, step{
		"pod_uid":             pod.Metadata.UID,
		"found":               response.GetFound(),
		"released":            usageFields(response.GetReleased()),
		"released_memory_mib": memoryMiB(response.GetReleased()),
	})
}

func reserve(c clients, out *report, name string, pod *kubePod, nodeName, uuid string, memory int64) {
	typed, err := typedPod(pod)
	if err != nil {
		out.add(name, status.Error(codes.InvalidArgument, err.Error()), nil)
		return
	}
	grants := []*accountingv1.ContainerGrants{{
		ContainerName:  pod.Spec.Containers[0].Name,
		ContainerClass: accountingv1.ContainerClass_CONTAINER_CLASS_APP,
		Grants:         []*accountingv1.DeviceGrant{{Uuid: uuid, DeviceType: vendorNVIDIA, MemoryMib: memory}},
	}}
	ctx := hamiaccounting.WithTraceparent(context.Background(), pod.Metadata.Annotations[annotationTraceparent])
	response, err := c.Usage.Reserve(ctx, &accountingv1.ReserveRequest{
		PodSource:       &accountingv1.ReserveRequest_Pod{Pod: typed},
		NodeName:        nodeName,
		ContainerGrants: grants,
	})
	c.NoteRevision(response.GetRevision())
	out.add(name, err, step{
		"pod_uid":           pod.Metadata.UID,
		"node_name":         nodeName,
		"uuid":              uuid,
		"memory_mib":        memory,
		"reserved":          response.GetReserved(),
		"reason":            response.GetReason(),
		"message":           response.GetMessage(),
		"stored":            usageFields(response.GetStored()),
		"stored_memory_mib": memoryMiB(response.GetStored()),
	})
}

func podUsage(c clients, out *report, name string, pod *kubePod) {
	ctx := hamiaccounting.WithTraceparent(context.Background(), pod.Metadata.Annotations[annotationTraceparent])
	response, err := c.Usage.GetPodUsage(ctx, &accountingv1.GetPodUsageRequest{PodUid: pod.Metadata.UID})
	out.add(name, err, step{
		"pod_uid":           pod.Metadata.UID,
		"found":             response.GetFound(),
		"namespace":         response.GetNamespace(),
		"name":              response.GetName(),
		"node_name":         response.GetNodeName(),
		"init_released":     response.GetInitReleased(),
		"stored":            usageFields(response.GetStored()),
		"stored_memory_mib": memoryMiB(response.GetStored()),
	})
}

func nodeUsage(c clients, out *report, name string, nodeNames []string) {
	response, err := c.Usage.GetNodeUsage(context.Background(), &accountingv1.GetNodeUsageRequest{NodeNames: nodeNames})
	nodes := []step{}
	for _, node := range response.GetNodes() {
		nodes = append(nodes, nodeUsageFields(node))
	}
	out.add(name, err, step{
		"node_names":         nodeNames,
		"nodes":              nodes,
		"unknown_node_names": response.GetUnknownNodeNames(),
	})
}

func namespaceUsage(cfg config, c clients, out *report, name string) {
	response, err := c.Usage.GetNamespaceUsage(context.Background(), &accountingv1.GetNamespaceUsageRequest{Namespace: cfg.namespace})
	out.add(name, err, step{
		"namespace":   cfg.namespace,
		"items":       quotaItemFields(response.GetItems()),
		"gpumem_used": quotaUsed(response.GetItems(), resourceGPUMem),
	})
}

// watcher collects WatchUsage events in the background.
type watcher struct {
	cancel context.CancelFunc
	events chan *accountingv1.UsageEvent
	done   chan error
	opened error
}

func startWatch(cfg config, c clients) *watcher {
	w := &watcher{cancel: func() {}, events: make(chan *accountingv1.UsageEvent, 1024), done: make(chan error, 1)}
	first := make(chan struct{})
	var once sync.Once
	// doc:begin watch
	// A cache in front of the recorder: the current state first (SNAPSHOT
	// events), then every change, until the deadline or cancel ends the stream.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.watchTimeout)
	stream, err := c.Usage.WatchUsage(ctx, &accountingv1.WatchUsageRequest{SendInitialState: true})
	if err != nil {
		cancel()
		close(w.events)
		w.done <- err
		w.opened = err
		return w
	}
	go func() {
		defer close(w.events)
		defer once.Do(func() { close(first) })
		for {
			event, err := stream.Recv() // Canceled / DeadlineExceeded end it
			if err != nil {
				w.done <- err
				return
			}
			w.events <- event
			once.Do(func() { close(first) })
		}
	}()
	// doc:end watch
	w.cancel = cancel
	// Wait for the first event (the initial SNAPSHOT) so the subscription is
	// live before the changes the caller is about to make.
	select {
	case <-first:
	case <-time.After(firstEventDeadline):
	}
	return w
}

// finish reads events until one says podUID was forgotten or the stream's
// deadline passes, then cancels the stream and reports what was seen.
func (w *watcher) finish(out *report, podUID string) {
	events := []step{}
	kinds := map[string]int{}
	sawForgotten := false
	for !sawForgotten {
		event, ok := <-w.events
		if !ok {
			break
		}
		kind := event.GetKind().String()
		kinds[kind]++
		events = append(events, step{
			"revision":              event.GetRevision(),
			"kind":                  kind,
			"pod_uid":               event.GetPodUid(),
			"namespace":             event.GetNamespace(),
			"namespace_gpumem_used": quotaUsed(event.GetNamespaceItems(), resourceGPUMem),
			"node_name":             event.GetNode().GetNodeName(),
			"node_memory_used_mib":  nodeMemoryUsed(event.GetNode()),
			"stored_memory_mib":     memoryMiB(event.GetStored()),
		})
		sawForgotten = event.GetKind() == accountingv1.UsageEventKind_USAGE_EVENT_KIND_POD_FORGOTTEN &&
			event.GetPodUid() == podUID
	}
	w.cancel()
	// Drain so the reader goroutine can end.
	for range w.events {
	}
	endErr := <-w.done
	fields := step{
		"events":          events,
		"kinds":           kinds,
		"saw_forgotten":   sawForgotten,
		"forgotten_uid":   podUID,
		"stream_end_code": status.Code(endErr).String(),
	}
	// The stream ends Canceled (we stopped it) or DeadlineExceeded (window
	// closed); only a failure to open it is an error of this step.
	out.add("watch_usage", w.opened, fields)
}

// malformed sends requests a daemon must refuse with INVALID_ARGUMENT.
// Each is sent once: INVALID_ARGUMENT is never retried.
func malformed(c clients, out *report) {
	before := c.attempts["usage"].get()
	_, err := c.Usage.RecordPod(context.Background(), &accountingv1.RecordPodRequest{})
	out.addExpectingError("malformed_record_pod_without_pod", err, step{
		"message": status.Convert(err).Message(), "attempts": c.attempts["usage"].get() - before,
	})

	before = c.attempts["admission"].get()
	response, err := c.CheckQuota(context.Background(),
		[]byte(`{"metadata":{"name":"broken","uid":"`+uidMalformed+`"`))
	allowed, verdict := hamiaccounting.Verdict(response, err)
	out.addExpectingError("malformed_check_quota_bad_json", err, step{
		"message": status.Convert(err).Message(), "webhook_allowed": allowed, "webhook_message": verdict,
		"attempts": c.attempts["admission"].get() - before,
	})
}

// unreachable checks a quota against an address nothing listens on: the
// webhook must end UNAVAILABLE after its retries and deny.
func unreachable(cfg config, out *report) {
	options, err := dialOptions(cfg)
	if err != nil {
		out.addExpectingError("unreachable_check_quota", err, nil)
		return
	}
	counted := &attempts{}
	conn, err := hamiaccounting.Dial(context.Background(), cfg.unreachableAddr, append(options, counted.option())...)
	if err != nil {
		out.addExpectingError("unreachable_check_quota", err, step{"address": cfg.unreachableAddr})
		return
	}
	defer conn.Close()
	pod := newPod(cfg.namespace, "llm-server-3", uidUnreachable, nil,
		[]kubeContainer{gpuContainer("server", containerImageServer, 1024)})
	started := time.Now()
	response, err := hamiaccounting.NewClient(conn, nil, nil).CheckQuota(context.Background(), pod)
	allowed, verdict := hamiaccounting.Verdict(response, err)
	out.addExpectingError("unreachable_check_quota", err, step{
		"address":         cfg.unreachableAddr,
		"attempts":        counted.get(),
		"policy_attempts": hamiaccounting.DefaultPolicies().For(hamiaccounting.MethodCheckQuota).Attempts,
		"elapsed_ms":      time.Since(started).Milliseconds(),
		"webhook_allowed": allowed,
		"webhook_message": verdict,
	})
}

// Report helpers: plain JSON numbers (protojson would quote int64s).

func usageFields(usages []*accountingv1.DeviceUsage) []step {
	fields := []step{}
	for _, usage := range usages {
		fields = append(fields, step{
			"uuid": usage.GetUuid(), "device_type": usage.GetDeviceType(), "memory_mib": usage.GetMemoryMib(),
			"core_percent": usage.GetCorePercent(), "slots": usage.GetSlots(),
		})
	}
	return fields
}

func memoryMiB(usages []*accountingv1.DeviceUsage) int64 {
	var total int64
	for _, usage := range usages {
		total += usage.GetMemoryMib()
	}
	return total
}

func containerGrantFields(containers []*accountingv1.ContainerGrants) []step {
	fields := []step{}
	for _, ctr := range containers {
		var grants []step
		var memory int64
		for _, grant := range ctr.GetGrants() {
			memory += grant.GetMemoryMib()
			grants = append(grants, step{
				"uuid": grant.GetUuid(), "device_type": grant.GetDeviceType(), "memory_mib": grant.GetMemoryMib(),
				"core_percent": grant.GetCorePercent(), "slots": grant.GetSlots(),
			})
		}
		fields = append(fields, step{
			"container_name": ctr.GetContainerName(), "container_class": ctr.GetContainerClass().String(),
			"grants": grants, "memory_mib": memory,
		})
	}
	return fields
}

func nodeUsageFields(node *accountingv1.NodeUsage) step {
	if node == nil {
		return nil
	}
	devices := []step{}
	for _, device := range node.GetDevices() {
		devices = append(devices, step{
			"uuid": device.GetUuid(), "device_type": device.GetDeviceType(), "vendor": device.GetVendor(),
			"memory_total_mib": device.GetMemoryTotalMib(), "memory_used_mib": device.GetMemoryUsedMib(),
			"cores_total": device.GetCoresTotal(), "cores_used": device.GetCoresUsed(),
			"slots_total": device.GetSlotsTotal(), "slots_used": device.GetSlotsUsed(),
			"healthy": device.GetHealthy(), "mode": device.GetMode(), "index": device.GetIndex(),
		})
	}
	return step{
		"node_name": node.GetNodeName(), "devices": devices, "pod_uids": node.GetPodUids(),
		"memory_used_mib": nodeMemoryUsed(node),
	}
}

func nodeMemoryUsed(node *accountingv1.NodeUsage) int64 {
	var total int64
	for _, device := range node.GetDevices() {
		total += device.GetMemoryUsedMib()
	}
	return total
}

func quotaItemFields(items []*accountingv1.QuotaItem) []step {
	fields := []step{}
	for _, item := range items {
		fields = append(fields, step{
			"resource": item.GetResource(), "used": item.GetUsed(), "limit": item.GetLimit(),
			"limit_set": item.GetLimitSet(),
		})
	}
	return fields
}

// quotaUsed is the used figure of one resource, or nil when it is not listed.
func quotaUsed(items []*accountingv1.QuotaItem, resource string) interface{} {
	for _, item := range items {
		if strings.EqualFold(item.GetResource(), resource) {
			return item.GetUsed()
		}
	}
	return nil
}
