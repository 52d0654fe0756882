// The kube-scheduler side of the extender protocol (hamiclient -mode extender).
//
// Beside HAMi as released, our scheduler daemon answers kube-scheduler's
// HTTP extender itself (POST <urlPrefix>/filter, docs/extender.md): HAMi's Go
// code does not change, and the Go caller is kube-scheduler. Neither
// kube-scheduler nor k8s.io/kube-scheduler is packaged in Debian, so this file
// mirrors the two parts that make up the wire: the types of
// k8s.io/kube-scheduler/extender/v1 (extender/v1/types.go) and what
// kube-scheduler's HTTPExtender (k8s.io/kubernetes pkg/scheduler/extender.go)
// does with them: json.Marshal of the arguments, one POST with
// Content-Type: application/json under the extender's httpTimeout, any status
// but 200 an error, the answer read with encoding/json's Decoder, then the
// checks of its Filter. tests/interop/test_go_extender.py runs it and checks
// what it printed, the pods on the fake API server and the recorder.
package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/hami-accounting/hami-accounting/clients/go/hamiaccounting"
)

// doc:begin extender-types
// extenderArgs mirrors ExtenderArgs of k8s.io/kube-scheduler/extender/v1
// (extender/v1/types.go). Like upstream it has NO json tags: json.Marshal
// writes the Go field names, and the form not used is null.
type extenderArgs struct {
	// Pod is the pod being scheduled.
	Pod *kubePod
	// Nodes are the candidates as Node objects (the extender is not
	// nodeCacheCapable).
	Nodes *kubeNodeList
	// NodeNames are the candidates by name (nodeCacheCapable: true).
	NodeNames *[]string
}

// failedNodesMap mirrors FailedNodesMap of the same file: node name → why.
type failedNodesMap map[string]string

// extenderFilterResult mirrors ExtenderFilterResult of the same file, also
// with NO json tags: encoding/json matches the answer's keys to these names
// without regard to case, as kube-scheduler reads them.
type extenderFilterResult struct {
	// Nodes are the Node objects that pass (not nodeCacheCapable).
	Nodes *kubeNodeList
	// NodeNames are the names of the nodes that pass (nodeCacheCapable).
	NodeNames *[]string
	// FailedNodes are refused for reasons preemption may lift.
	FailedNodes failedNodesMap
	// FailedAndUnresolvableNodes are refused for reasons it cannot lift.
	FailedAndUnresolvableNodes failedNodesMap
	// Error fails the scheduling attempt; kube-scheduler retries the pod.
	Error string
}

// doc:end extender-types

const (
	extenderFilterVerb = "filter"
	// defaultExtenderHTTPTimeout is kube-scheduler's DefaultExtenderTimeout;
	// HAMi's chart sets its own extender's httpTimeout to 30s.
	defaultExtenderHTTPTimeout = 5 * time.Second
	kubeAPITimeout             = 10 * time.Second

	templateNodeSmall  = "template-small"
	templateNodeLarge  = "template-large"
	templateNodeBroken = "template-broken"
)

// Fixed pod UIDs of the extender scenario.
const (
	uidExtPlaced    = "e1a5e001-6f1c-4c2e-9d0a-000000000001"
	uidExtPlain     = "e2a5e002-6f1c-4c2e-9d0a-000000000002"
	uidExtQuota     = "e3a5e003-6f1c-4c2e-9d0a-000000000003"
	uidExtSimulated = "e4a5e004-6f1c-4c2e-9d0a-000000000004"
)

type extenderConfig struct {
	extenderURL    string
	kubeAPIURL     string
	namespace      string
	quotaNamespace string
	httpTimeout    time.Duration
}

// httpExtender is kube-scheduler's HTTPExtender with a filter verb only.
type httpExtender struct {
	extenderURL      string
	filterVerb       string
	nodeCacheCapable bool
	client           *http.Client
}

// newHTTPExtender builds the client as kube-scheduler does: its transport
// through utilnet.SetTransportDefaults (the proxy from the environment, a
// 10 s TLS handshake, HTTP/2 offered over TLS), the client's Timeout the
// extender's httpTimeout.
func newHTTPExtender(urlPrefix string, nodeCacheCapable bool, tlsConfig *tls.Config, timeout time.Duration) *httpExtender {
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 25,
		ForceAttemptHTTP2:   true,
	}
	return &httpExtender{
		extenderURL:      urlPrefix,
		filterVerb:       extenderFilterVerb,
		nodeCacheCapable: nodeCacheCapable,
		client:           &http.Client{Transport: transport, Timeout: timeout},
	}
}

// doc:begin extender-send
// send POSTs args to <urlPrefix>/<verb> and decodes the answer into result.
// Like kube-scheduler, a status other than 200 is an error and its body is
// not read. The status is returned for the report.
func (h *httpExtender) send(verb string, args, result interface{}) (int, error) {
	body, err := json.Marshal(args)
	if err != nil {
		return 0, err
	}
	target := strings.TrimRight(h.extenderURL, "/") + "/" + verb
	request, err := http.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	request.Header.Set("Content-Type", "application/json")
	response, err := h.client.Do(request)
	if err != nil {
		return 0, err
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		return response.StatusCode, fmt.Errorf("failed %v with extender at URL %v, code %v",
			verb, target, response.StatusCode)
	}
	return response.StatusCode, json.NewDecoder(response.Body).Decode(result)
}

// doc:end extender-send

// filterArgs are the arguments kube-scheduler's Filter sends for candidates:
// their names when the extender is nodeCacheCapable, else the Node objects.
func (h *httpExtender) filterArgs(pod *kubePod, candidates []kubeNode) extenderArgs {
	args := extenderArgs{Pod: pod}
	if h.nodeCacheCapable {
		names := make([]string, 0, len(candidates))
		for _, node := range candidates {
			names = append(names, node.Metadata.Name)
		}
		args.NodeNames = &names
	} else {
		args.Nodes = &kubeNodeList{}
		args.Nodes.Items = append(args.Nodes.Items, candidates...)
	}
	return args
}

// filtered is one Filter call: the answer as decoded, and what
// kube-scheduler's Filter makes of it.
type filtered struct {
	status int
	result extenderFilterResult
	// kept are the nodes that pass: the NodeNames answered (each must be a
	// candidate), else the Nodes answered.
	kept []string
	// err is the error Filter returns: the transport's, a status other than
	// 200, the answer's Error, or a node that was no candidate.
	err error
}

func (h *httpExtender) filter(pod *kubePod, candidates []kubeNode) filtered {
	out := filtered{kept: []string{}}
	args := h.filterArgs(pod, candidates)
	out.status, out.err = h.send(h.filterVerb, &args, &out.result)
	if out.err != nil {
		return out
	}
	if out.result.Error != "" {
		out.err = errors.New(out.result.Error)
		return out
	}
	if h.nodeCacheCapable && out.result.NodeNames != nil {
		given := map[string]bool{}
		for _, node := range candidates {
			given[node.Metadata.Name] = true
		}
		for _, name := range *out.result.NodeNames {
			if !given[name] {
				out.err = fmt.Errorf("extender %q claims a filtered node %q which is not found in the input node list",
					h.extenderURL, name)
				out.kept = []string{}
				return out
			}
			out.kept = append(out.kept, name)
		}
	} else if out.result.Nodes != nil {
		for _, node := range out.result.Nodes.Items {
			out.kept = append(out.kept, node.Metadata.Name)
		}
	}
	return out
}

// runExtender walks the extender scenario. A failed step is reported and the
// walk goes on.
func runExtender(cfg config, ext extenderConfig) *report {
	out := &report{
		UnexpectedErrors: []string{},
		Addresses:        map[string]string{"extender": ext.extenderURL, "kubernetes": ext.kubeAPIURL},
		Steps:            []step{},
	}
	defer func() { out.OK = len(out.UnexpectedErrors) == 0 }()

	var tlsConfig *tls.Config
	if cfg.tlsCA != "" || cfg.tlsCert != "" {
		var err error
		tlsConfig, err = hamiaccounting.LoadTLSConfig(cfg.tlsCert, cfg.tlsKey, cfg.tlsCA, cfg.tlsServerName)
		if err != nil {
			out.addHTTP("tls_config", err, nil)
			return out
		}
	}
	cached := newHTTPExtender(ext.extenderURL, true, tlsConfig, ext.httpTimeout)
	uncached := newHTTPExtender(ext.extenderURL, false, tlsConfig, ext.httpTimeout)
	registered := nodesNamed("node-a", "node-b")

	// A pod with an init container, a native sidecar and an app, created on
	// the API server first: kube-scheduler sends the copy its informer holds.
	placed := createPod(out, ext, "create_placed", extenderPod(ext.namespace, "ext-placed", uidExtPlaced))
	if placed != nil {
		filterStep(out, "placed", cached, placed, registered)
		// kube-scheduler filters a pod again when a later step of its
		// attempt failed: the same answer, the reservation replaced.
		filterStep(out, "placed_again", cached, placed, registered)
	}

	// A pod without GPUs passes with every candidate.
	plain := createPod(out, ext, "create_plain", newPod(ext.namespace, "ext-plain", uidExtPlain, nil,
		[]kubeContainer{{Name: "app", Image: containerImageServer}}))
	if plain != nil {
		filterStep(out, "no_gpu", cached, plain, nodesNamed("node-a", "node-b", "node-c"))
	}

	// A pod over its namespace's quota: refused on every node, and no
	// preemption can help.
	quota := createPod(out, ext, "create_quota", extenderPod(ext.quotaNamespace, "ext-quota", uidExtQuota))
	if quota != nil {
		filterStep(out, "quota_refused", cached, quota, registered)
	}

	// The Nodes form: template nodes nobody registered (Cluster Autoscaler's
	// simulation), sent by an extender that is not nodeCacheCapable.
	templates := templateNodes()
	simulated := extenderPod(ext.namespace, "ext-simulated", uidExtSimulated)
	fields := filterStep(out, "simulation", uncached, simulated, templates)
	if items, ok := fields["nodes_items"].([]kubeNode); ok && len(items) == 1 {
		fields["node_as_sent"] = reflect.DeepEqual(items[0], templates[1])
	}
	delete(fields, "nodes_items")

	// With mutual TLS, kube-scheduler without its client certificate is
	// refused at the handshake.
	if tlsConfig != nil && len(tlsConfig.Certificates) > 0 {
		anonymous := tlsConfig.Clone()
		anonymous.Certificates = nil
		refused := newHTTPExtender(ext.extenderURL, true, anonymous, ext.httpTimeout).filter(simulated, registered)
		out.Steps = append(out.Steps, step{"step": "no_client_certificate", "status": refused.status,
			"scheduler_error": errorText(refused.err)})
	}
	return out
}

// addHTTP records a step that must succeed (the creation of a pod, the TLS
// configuration); the extender's answers are judged by the test.
func (r *report) addHTTP(name string, err error, fields step) step {
	if fields == nil {
		fields = step{}
	}
	fields["step"] = name
	fields["error"] = errorText(err)
	if err != nil {
		r.UnexpectedErrors = append(r.UnexpectedErrors, fmt.Sprintf("%s: %v", name, err))
	}
	r.Steps = append(r.Steps, fields)
	return fields
}

// filterStep sends one Filter and reports what Go decoded and what
// kube-scheduler would do with it.
func filterStep(out *report, name string, extender *httpExtender, pod *kubePod, candidates []kubeNode) step {
	args := extender.filterArgs(pod, candidates)
	wire, err := json.Marshal(&args)
	keys := []string{}
	var topLevel map[string]json.RawMessage
	if err == nil && json.Unmarshal(wire, &topLevel) == nil {
		for key, value := range topLevel {
			keys = append(keys, key+"="+jsonKind(value))
		}
		sort.Strings(keys)
	}
	answer := extender.filter(pod, candidates)
	fields := step{
		"step":                          name,
		"pod_uid":                       pod.Metadata.UID,
		"request_fields":                keys,
		"status":                        answer.status,
		"node_names":                    answer.result.NodeNames,
		"failed_nodes":                  answer.result.FailedNodes,
		"failed_and_unresolvable_nodes": answer.result.FailedAndUnresolvableNodes,
		"error":                         answer.result.Error,
		"scheduler_kept":                answer.kept,
		"scheduler_error":               errorText(answer.err),
	}
	if answer.result.Nodes == nil {
		fields["nodes"] = nil
	} else {
		names := []string{}
		for _, node := range answer.result.Nodes.Items {
			names = append(names, node.Metadata.Name)
		}
		fields["nodes"] = names
		fields["nodes_items"] = answer.result.Nodes.Items
	}
	out.Steps = append(out.Steps, fields)
	return fields
}

// jsonKind names what a raw JSON value is, for the report of the request's
// top-level fields.
func jsonKind(value json.RawMessage) string {
	trimmed := bytes.TrimSpace(value)
	switch {
	case bytes.Equal(trimmed, []byte("null")):
		return "null"
	case len(trimmed) > 0 && trimmed[0] == '{':
		return "object"
	case len(trimmed) > 0 && trimmed[0] == '[':
		return "array"
	}
	return "scalar"
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// extenderPod is test_extender.py's pod: an init container with 20480 MiB, a
// native sidecar with 2048 MiB, an app with 10240 MiB, one GPU each.
func extenderPod(namespace, name, uid string) *kubePod {
	sidecar := gpuContainer("side", containerImageServer, 2048)
	always := restartPolicyAlways
	sidecar.RestartPolicy = &always
	return newPod(namespace, name, uid,
		[]kubeContainer{gpuContainer("init", containerImageInit, 20480), sidecar},
		[]kubeContainer{gpuContainer("app", containerImageServer, 10240)})
}

// nodesNamed are the candidates kube-scheduler holds in its snapshot; with
// nodeCacheCapable only their names are sent.
func nodesNamed(names ...string) []kubeNode {
	nodes := make([]kubeNode, 0, len(names))
	for _, name := range names {
		nodes = append(nodes, kubeNode{Metadata: objectMeta{Name: name}})
	}
	return nodes
}

// templateNodes are a simulation's nodes: one 8 GiB GPU, two 24 GiB GPUs,
// and a register annotation that is not JSON.
func templateNodes() []kubeNode {
	node := func(name string, devices ...deviceInfo) kubeNode {
		register, err := json.Marshal(devices)
		if err != nil {
			panic(err)
		}
		return kubeNode{Metadata: objectMeta{Name: name,
			Annotations: map[string]string{annotationNodeRegister: string(register)}}}
	}
	device := func(uuid string, index uint, memoryMiB int32) deviceInfo {
		return deviceInfo{ID: uuid, Index: index, Count: gpuSplitCount, Devmem: memoryMiB, Devcore: 100,
			Type: gpuModel, Mode: "hami-core", Health: true}
	}
	broken := kubeNode{Metadata: objectMeta{Name: templateNodeBroken,
		Annotations: map[string]string{annotationNodeRegister: "[{"}}}
	return []kubeNode{
		node(templateNodeSmall, device("GPU-s0", 0, 8192)),
		node(templateNodeLarge, device("GPU-l0", 0, gpuMemoryMiB), device("GPU-l1", 1, gpuMemoryMiB)),
		broken,
	}
}

// createPod creates the pod on the Kubernetes API (what kubectl or a
// controller does before kube-scheduler sees it) and returns the API server's
// copy, as kube-scheduler's informer holds it.
func createPod(out *report, ext extenderConfig, name string, pod *kubePod) *kubePod {
	body, err := json.Marshal(pod)
	if err != nil {
		panic(err)
	}
	target := strings.TrimRight(ext.kubeAPIURL, "/") + "/api/v1/namespaces/" +
		url.PathEscape(pod.Metadata.Namespace) + "/pods"
	client := &http.Client{Timeout: kubeAPITimeout}
	response, err := client.Post(target, "application/json", bytes.NewReader(body))
	if err != nil {
		out.addHTTP(name, err, nil)
		return nil
	}
	defer response.Body.Close()
	answer, err := io.ReadAll(response.Body)
	if err == nil && response.StatusCode != http.StatusCreated {
		err = fmt.Errorf("POST %s: %d %s", target, response.StatusCode, answer)
	}
	created := &kubePod{}
	if err == nil {
		err = json.Unmarshal(answer, created)
	}
	out.addHTTP(name, err, step{"pod_uid": created.Metadata.UID,
		"resource_version": created.Metadata.ResourceVersion})
	if err != nil {
		return nil
	}
	return created
}
