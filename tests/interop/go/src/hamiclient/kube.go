// Kubernetes object shapes for the Go interop client.
//
// k8s.io/api is not packaged in Debian, so these structs mirror the parts of
// corev1.Pod and corev1.Node that HAMi's pods and nodes carry, with the same
// JSON names and omitempty rules: json.Marshal of these values is byte-for-byte
// what json.Marshal(corev1.Pod) writes for the same pod (metav1.Time zero
// values are null, quantities are strings, ContainerState is always written).
package main

import (
	"encoding/json"
	"sort"
	"strconv"

	accountingv1 "github.com/hami-accounting/hami-accounting/clients/go/accountingv1"
)

// HAMi resource names and annotations (docs/design.md §2.3, §5).
const (
	resourceGPUCount = "nvidia.com/gpu"
	resourceGPUMem   = "nvidia.com/gpumem"
	resourceGPUCores = "nvidia.com/gpucores"

	annotationTraceparent      = "hami.io/traceparent"
	annotationDevicesAllocated = "hami.io/vgpu-devices-allocated"
	annotationDevicesToAlloc   = "hami.io/vgpu-devices-to-allocate"
	annotationVGPUNode         = "hami.io/vgpu-node"
	annotationBindPhase        = "hami.io/bind-phase"
	annotationNodeRegister     = "hami.io/node-nvidia-register"

	vendorNVIDIA         = "NVIDIA"
	restartPolicyAlways  = "Always"
	podPhasePending      = "Pending"
	podPhaseRunning      = "Running"
	containerImageServer = "registry.example/llm-server:1.0"
	containerImageInit   = "registry.example/convert-weights:1.0"
)

// objectMeta mirrors metav1.ObjectMeta (creationTimestamp is a metav1.Time:
// its zero value marshals as null).
type objectMeta struct {
	Name              string            `json:"name,omitempty"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	CreationTimestamp *string           `json:"creationTimestamp"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
}

// resourceRequirements mirrors corev1.ResourceRequirements (quantities are
// resource.Quantity, which marshals as a string).
type resourceRequirements struct {
	Limits   map[string]string `json:"limits,omitempty"`
	Requests map[string]string `json:"requests,omitempty"`
}

// kubeContainer mirrors corev1.Container.
type kubeContainer struct {
	Name          string               `json:"name"`
	Image         string               `json:"image,omitempty"`
	Resources     resourceRequirements `json:"resources"`
	RestartPolicy *string              `json:"restartPolicy,omitempty"`
}

// podSpec mirrors corev1.PodSpec.
type podSpec struct {
	InitContainers []kubeContainer `json:"initContainers,omitempty"`
	Containers     []kubeContainer `json:"containers"`
	RestartPolicy  string          `json:"restartPolicy,omitempty"`
	NodeName       string          `json:"nodeName,omitempty"`
	SchedulerName  string          `json:"schedulerName,omitempty"`
}

type containerStateWaiting struct {
	Reason string `json:"reason,omitempty"`
}

type containerStateRunning struct {
	StartedAt *string `json:"startedAt"`
}

type containerStateTerminated struct {
	ExitCode   int32   `json:"exitCode"`
	Reason     string  `json:"reason,omitempty"`
	StartedAt  *string `json:"startedAt"`
	FinishedAt *string `json:"finishedAt"`
}

// containerState mirrors corev1.ContainerState.
type containerState struct {
	Waiting    *containerStateWaiting    `json:"waiting,omitempty"`
	Running    *containerStateRunning    `json:"running,omitempty"`
	Terminated *containerStateTerminated `json:"terminated,omitempty"`
}

// containerStatus mirrors corev1.ContainerStatus.
type containerStatus struct {
	Name                 string         `json:"name"`
	State                containerState `json:"state,omitempty"`
	LastTerminationState containerState `json:"lastState,omitempty"`
	Ready                bool           `json:"ready"`
	RestartCount         int32          `json:"restartCount"`
	Image                string         `json:"image"`
	ImageID              string         `json:"imageID"`
	Started              *bool          `json:"started,omitempty"`
}

// podStatus mirrors corev1.PodStatus.
type podStatus struct {
	Phase                 string            `json:"phase,omitempty"`
	InitContainerStatuses []containerStatus `json:"initContainerStatuses,omitempty"`
	ContainerStatuses     []containerStatus `json:"containerStatuses,omitempty"`
}

// kubePod mirrors corev1.Pod as an informer or an AdmissionReview hands it over.
type kubePod struct {
	Kind       string     `json:"kind,omitempty"`
	APIVersion string     `json:"apiVersion,omitempty"`
	Metadata   objectMeta `json:"metadata"`
	Spec       podSpec    `json:"spec"`
	Status     podStatus  `json:"status"`
}

// nodeStatus mirrors the corev1.NodeStatus fields HAMi reads.
type nodeStatus struct {
	Capacity    map[string]string `json:"capacity,omitempty"`
	Allocatable map[string]string `json:"allocatable,omitempty"`
}

// kubeNode mirrors corev1.Node.
type kubeNode struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct{}   `json:"spec"`
	Status   nodeStatus `json:"status"`
}

// listMeta mirrors metav1.ListMeta (every field omitempty).
type listMeta struct {
	ResourceVersion string `json:"resourceVersion,omitempty"`
}

// kubeNodeList mirrors corev1.NodeList. Its ListMeta is a struct, which
// encoding/json never omits: an empty list is {"metadata":{},"items":[...]}.
type kubeNodeList struct {
	Kind       string     `json:"kind,omitempty"`
	APIVersion string     `json:"apiVersion,omitempty"`
	Metadata   listMeta   `json:"metadata,omitempty"`
	Items      []kubeNode `json:"items"`
}

// deviceInfo mirrors HAMi's api.DeviceInfo as the device plugin marshals it
// into hami.io/node-nvidia-register: every key is omitted when zero.
type deviceInfo struct {
	ID      string `json:"id,omitempty"`
	Index   uint   `json:"index,omitempty"`
	Count   int32  `json:"count,omitempty"`
	Devmem  int32  `json:"devmem,omitempty"`
	Devcore int32  `json:"devcore,omitempty"`
	Type    string `json:"type,omitempty"`
	Numa    int    `json:"numa,omitempty"`
	Mode    string `json:"mode,omitempty"`
	Health  bool   `json:"health,omitempty"`
}

// gpuContainer is a container asking for one GPU with memoryMiB of it.
func gpuContainer(name, image string, memoryMiB int64) kubeContainer {
	return kubeContainer{
		Name:  name,
		Image: image,
		Resources: resourceRequirements{Limits: map[string]string{
			resourceGPUCount: "1",
			resourceGPUMem:   strconv.FormatInt(memoryMiB, 10),
		}},
	}
}

// newPod builds a fresh pod (no status yet, as the webhook sees it) with
// regular init containers and app containers.
func newPod(namespace, name, uid string, initContainers, containers []kubeContainer) *kubePod {
	return &kubePod{
		Metadata: objectMeta{
			Name:        name,
			Namespace:   namespace,
			UID:         uid,
			Annotations: map[string]string{},
		},
		Spec: podSpec{
			InitContainers: initContainers,
			Containers:     containers,
			RestartPolicy:  "Always",
			SchedulerName:  "hami-scheduler",
		},
	}
}

// clonePod deep-copies a pod through its JSON form.
func clonePod(pod *kubePod) *kubePod {
	raw, err := json.Marshal(pod)
	if err != nil {
		panic(err)
	}
	out := &kubePod{}
	if err := json.Unmarshal(raw, out); err != nil {
		panic(err)
	}
	if out.Metadata.Annotations == nil {
		out.Metadata.Annotations = map[string]string{}
	}
	return out
}

func timestamp(value string) *string { return &value }

func boolPointer(value bool) *bool { return &value }

// runningStatus is the status of a container the kubelet reports as running.
func runningStatus(name, image string) containerStatus {
	return containerStatus{
		Name:    name,
		State:   containerState{Running: &containerStateRunning{StartedAt: timestamp("2026-11-30T10:00:00Z")}},
		Ready:   true,
		Image:   image,
		Started: boolPointer(true),
	}
}

// waitingStatus is the status of a container waiting to start.
func waitingStatus(name, image, reason string) containerStatus {
	return containerStatus{
		Name:    name,
		State:   containerState{Waiting: &containerStateWaiting{Reason: reason}},
		Image:   image,
		Started: boolPointer(false),
	}
}

// completedStatus is the status of a container that exited with exitCode.
func completedStatus(name, image string, exitCode int32) containerStatus {
	reason := "Completed"
	if exitCode != 0 {
		reason = "Error"
	}
	return containerStatus{
		Name: name,
		State: containerState{Terminated: &containerStateTerminated{
			ExitCode:   exitCode,
			Reason:     reason,
			StartedAt:  timestamp("2026-11-30T10:00:00Z"),
			FinishedAt: timestamp("2026-11-30T10:04:00Z"),
		}},
		Image:   image,
		Started: boolPointer(false),
	}
}

// typedPod converts the Kubernetes pod into the typed Pod message: containers
// in declaration order (init containers first), classified by restartPolicy,
// with their NVIDIA requests read from limits first, then requests.
func typedPod(pod *kubePod) (*accountingv1.Pod, error) {
	out := &accountingv1.Pod{
		Uid:         pod.Metadata.UID,
		Namespace:   pod.Metadata.Namespace,
		Name:        pod.Metadata.Name,
		NodeName:    pod.Metadata.Annotations[annotationVGPUNode],
		Annotations: map[string]string{},
		Status:      &accountingv1.PodStatus{Phase: typedPhase(pod.Status.Phase)},
	}
	if out.NodeName == "" {
		out.NodeName = pod.Spec.NodeName
	}
	for key, value := range pod.Metadata.Annotations {
		out.Annotations[key] = value
	}
	for _, ctr := range pod.Spec.InitContainers {
		class := accountingv1.ContainerClass_CONTAINER_CLASS_INIT
		if ctr.RestartPolicy != nil && *ctr.RestartPolicy == restartPolicyAlways {
			class = accountingv1.ContainerClass_CONTAINER_CLASS_SIDECAR
		}
		typed, err := typedContainer(ctr, class)
		if err != nil {
			return nil, err
		}
		out.Containers = append(out.Containers, typed)
	}
	for _, ctr := range pod.Spec.Containers {
		typed, err := typedContainer(ctr, accountingv1.ContainerClass_CONTAINER_CLASS_APP)
		if err != nil {
			return nil, err
		}
		out.Containers = append(out.Containers, typed)
	}
	out.Status.InitContainerStatuses = typedStatuses(pod.Status.InitContainerStatuses)
	out.Status.ContainerStatuses = typedStatuses(pod.Status.ContainerStatuses)
	return out, nil
}

func typedContainer(ctr kubeContainer, class accountingv1.ContainerClass) (*accountingv1.Container, error) {
	out := &accountingv1.Container{Name: ctr.Name, ContainerClass: class}
	quantity := func(name string) (int64, error) {
		value, ok := ctr.Resources.Limits[name]
		if !ok {
			value, ok = ctr.Resources.Requests[name]
		}
		if !ok {
			return 0, nil
		}
		return strconv.ParseInt(value, 10, 64)
	}
	count, err := quantity(resourceGPUCount)
	if err != nil || count == 0 {
		return out, err
	}
	memory, err := quantity(resourceGPUMem)
	if err != nil {
		return nil, err
	}
	cores, err := quantity(resourceGPUCores)
	if err != nil {
		return nil, err
	}
	out.Requests = []*accountingv1.DeviceRequest{{
		Vendor:      vendorNVIDIA,
		Count:       int32(count),
		MemoryMib:   memory,
		CorePercent: int32(cores),
	}}
	return out, nil
}

func typedPhase(phase string) accountingv1.PodPhase {
	switch phase {
	case "Pending":
		return accountingv1.PodPhase_POD_PHASE_PENDING
	case "Running":
		return accountingv1.PodPhase_POD_PHASE_RUNNING
	case "Succeeded":
		return accountingv1.PodPhase_POD_PHASE_SUCCEEDED
	case "Failed":
		return accountingv1.PodPhase_POD_PHASE_FAILED
	case "Unknown":
		return accountingv1.PodPhase_POD_PHASE_UNKNOWN
	}
	return accountingv1.PodPhase_POD_PHASE_UNSPECIFIED
}

func typedStatuses(statuses []containerStatus) []*accountingv1.ContainerStatus {
	var out []*accountingv1.ContainerStatus
	for _, st := range statuses {
		typed := &accountingv1.ContainerStatus{Name: st.Name, RestartCount: st.RestartCount}
		switch {
		case st.State.Terminated != nil:
			typed.State = accountingv1.ContainerState_CONTAINER_STATE_TERMINATED
			typed.ExitCode = st.State.Terminated.ExitCode
		case st.State.Running != nil:
			typed.State = accountingv1.ContainerState_CONTAINER_STATE_RUNNING
		case st.State.Waiting != nil:
			typed.State = accountingv1.ContainerState_CONTAINER_STATE_WAITING
		}
		out = append(out, typed)
	}
	return out
}

// sortedKeys returns a map's keys in order, for stable output.
func sortedKeys(values map[string]string) []string {
	keys := make([]string, 0, len(values))
	for key := range values {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}
