package chartcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir   = "../helm/bypassd"
	fullValues = "../helm/bypassd/ci/full-values.yaml"
	release    = "bypassd"
	namespace  = "kube-system"
)

// leastPrivilege is the capability set of docs/operations.md ("Privileges").
var leastPrivilege = []string{"NET_ADMIN", "NET_RAW", "BPF", "PERFMON", "IPC_LOCK", "CHOWN", "NET_BIND_SERVICE"}

// serviceMonitor is the part of prometheus-operator's ServiceMonitor
// (monitoring.coreos.com/v1) that the chart uses, with the CRD's field names
// and types: spec.selector (a label selector), spec.endpoints[].port (a
// Service port name), .path, .interval (a Prometheus duration). Decoded
// strictly, a field the chart writes outside this subset fails the test;
// widen the struct only from the CRD's schema.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// promDuration is the CRD's pattern for endpoints[].interval.
var promDuration = regexp.MustCompile(`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)

// rendered is one rendering of the chart, decoded.
type rendered struct {
	ds         *appsv1.DaemonSet
	configMaps map[string]*corev1.ConfigMap
	services   []*corev1.Service
	monitors   []*serviceMonitor
}

func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	if file == "" {
		return map[string]any{}
	}
	v, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var valueSets = []struct{ name, file string }{{"Default", ""}, {"FullValues", fullValues}}

// TestLint is `helm lint --strict` (warnings fail too) for both value sets.
func TestLint(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			l := action.NewLint()
			l.Strict = true
			l.Namespace = namespace
			r := l.Run([]string{chartDir}, readValues(t, vs.file))
			for _, m := range r.Messages {
				t.Log(m)
			}
			for _, err := range r.Errors {
				t.Errorf("helm lint: %v", err)
			}
			if r.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts, want 1", r.TotalChartsLinted)
			}
		})
	}
}

// render is `helm template bypassd deploy/helm/bypassd -n kube-system [-f
// file]`, each manifest decoded strictly into its type.
func render(t *testing.T, valuesFile string) *rendered {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(&action.Configuration{Log: t.Logf})
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.ReleaseName, in.Namespace = release, namespace
	rel, err := in.Run(chrt, readValues(t, valuesFile))
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	r := &rendered{configMaps: map[string]*corev1.ConfigMap{}}
	for _, doc := range strings.Split(rel.Manifest, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("manifest: %v\n%s", err, doc)
		}
		into := func(v any) {
			t.Helper()
			if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
				t.Fatalf("%s/%s does not decode strictly: %v\n%s", tm.APIVersion, tm.Kind, err, doc)
			}
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 DaemonSet":
			if r.ds != nil {
				t.Fatal("two DaemonSets")
			}
			r.ds = new(appsv1.DaemonSet)
			into(r.ds)
		case "v1 ConfigMap":
			cm := new(corev1.ConfigMap)
			into(cm)
			r.configMaps[cm.Name] = cm
		case "v1 Service":
			s := new(corev1.Service)
			into(s)
			r.services = append(r.services, s)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			m := new(serviceMonitor)
			into(m)
			r.monitors = append(r.monitors, m)
		default:
			t.Fatalf("unexpected object %s %s (add its type to the test):\n%s", tm.APIVersion, tm.Kind, doc)
		}
	}
	if r.ds == nil {
		t.Fatalf("no DaemonSet rendered:\n%s", rel.Manifest)
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestTemplateDefault: least privilege and the shape docs/deploy-kubernetes.md
// describes; deploy/k8s/daemonset.yaml is this rendering's DaemonSet.
func TestTemplateDefault(t *testing.T) {
	r := render(t, "")
	c := checkDaemonSet(t, r.ds, leastPrivilege)
	if want := []string{"--interface=eth1", "--queues=0", "--fallback=none", "--socket-group=65532",
		"--socket-mode=0660", "--metrics-addr=:9464"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q", c.Args, want)
	}
	if sp := c.SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %+v, want RuntimeDefault", sp)
	}
	if len(r.services)+len(r.monitors) != 0 {
		t.Error("Service or ServiceMonitor rendered with serviceMonitor.enabled false")
	}
	if _, ok := r.configMaps[release+"-qos"]; ok {
		t.Error("QoS ConfigMap rendered without qos.interfaces")
	}
	checkDashboard(t, r)

	b, err := os.ReadFile("../k8s/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var plain appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &plain); err != nil {
		t.Fatalf("deploy/k8s/daemonset.yaml does not decode strictly: %v", err)
	}
	if !reflect.DeepEqual(plain.Spec, r.ds.Spec) || plain.Name != r.ds.Name {
		got, _ := yaml.Marshal(r.ds.Spec)
		t.Errorf("deploy/k8s/daemonset.yaml is not the chart's default rendering; its spec should be:\n%s", got)
	}
}

// TestTemplateFullValues: every value reaches the manifest it is for.
func TestTemplateFullValues(t *testing.T) {
	r := render(t, fullValues)
	c := checkDaemonSet(t, r.ds, append(slices.Clone(leastPrivilege), "SYS_NICE"))
	for _, want := range []string{"--interface=eth1", "--interface=eth2:0-3", "--queues=4", "--socket-group=2000",
		"--metrics-addr=:9500", "--pacing-table-size=32", "--pacing-min-kbps=500", "--pacing-max-kbps=100000000",
		"--pacing-max-queues=1024", "--pacing-full-policy=nearest", "--engine-priority=10", "--traffic-class=184",
		"--ttl=64", "--qos-file=/etc/bypassd/qos/qos.json", "--frames=8192", "--log-level=debug"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %q", c.Args, want)
		}
	}
	spec := r.ds.Spec.Template.Spec
	if spec.PriorityClassName != "system-node-critical" || spec.NodeSelector["bypassd.io/accelerate"] != "true" ||
		len(spec.Tolerations) != 1 || len(spec.ImagePullSecrets) != 1 || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("pod spec lacks values: priorityClassName %q nodeSelector %v tolerations %v pullSecrets %v pullPolicy %q",
			spec.PriorityClassName, spec.NodeSelector, spec.Tolerations, spec.ImagePullSecrets, c.ImagePullPolicy)
	}
	if sp := c.SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeLocalhost ||
		sp.LocalhostProfile == nil || *sp.LocalhostProfile != "bypassd.json" {
		t.Errorf("seccompProfile %+v, want Localhost bypassd.json", sp)
	}
	if got := c.Resources.Limits.Memory().String(); got != "2Gi" {
		t.Errorf("memory limit %s, want 2Gi", got)
	}
	if hp := spec.Volumes[0].HostPath; hp == nil || hp.Path != "/var/run/bypassd" {
		t.Errorf("run volume %+v, want hostPath /var/run/bypassd", spec.Volumes[0])
	}

	// The QoS file: the values' interfaces, as the daemon reads it, mounted
	// where --qos-file points, and a checksum that rolls the pods.
	cm, ok := r.configMaps[release+"-qos"]
	if !ok {
		t.Fatal("no QoS ConfigMap")
	}
	var qos struct {
		Interfaces map[string]struct {
			TSA   []string `json:"tsa"`
			TCBW  []int    `json:"tcbw"`
			Trust string   `json:"trust"`
		} `json:"interfaces"`
	}
	dec := json.NewDecoder(strings.NewReader(cm.Data["qos.json"]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&qos); err != nil {
		t.Fatalf("qos.json: %v\n%s", err, cm.Data["qos.json"])
	}
	if e := qos.Interfaces["eth1"]; len(e.TSA) != 8 || e.TSA[2] != "strict" || e.TCBW[1] != 70 || e.Trust != "dscp" {
		t.Errorf("qos.json eth1 = %+v", e)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || m.MountPath == "/etc/bypassd/qos" && m.ReadOnly
	}
	if !mounted || r.ds.Spec.Template.Annotations["checksum/qos"] == "" {
		t.Errorf("QoS ConfigMap not mounted read-only at /etc/bypassd/qos, or no checksum annotation: %+v", c.VolumeMounts)
	}
	checkDashboard(t, r)

	// The ServiceMonitor scrapes the headless Service's metrics port,
	// which selects the DaemonSet's pods.
	if len(r.services) != 1 || len(r.monitors) != 1 {
		t.Fatalf("%d Services and %d ServiceMonitors, want 1 and 1", len(r.services), len(r.monitors))
	}
	svc, mon := r.services[0], r.monitors[0]
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9500 ||
		svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service spec %+v", svc.Spec)
	}
	if !selects(svc.Spec.Selector, r.ds.Spec.Template.Labels) {
		t.Errorf("Service selector %v does not select the pods (%v)", svc.Spec.Selector, r.ds.Spec.Template.Labels)
	}
	if !selects(mon.Spec.Selector.MatchLabels, svc.Labels) || mon.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor selector %v does not select the Service (%v), or labels %v lack release", mon.Spec.Selector.MatchLabels, svc.Labels, mon.Labels)
	}
	if len(mon.Spec.Endpoints) != 1 || mon.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name ||
		mon.Spec.Endpoints[0].Interval != "30s" || !promDuration.MatchString(mon.Spec.Endpoints[0].Interval) {
		t.Errorf("ServiceMonitor endpoints %+v", mon.Spec.Endpoints)
	}
}

// checkDaemonSet checks what every rendering must have and returns the
// daemon's container.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, caps []string) corev1.Container {
	t.Helper()
	if ds.Name != release || ds.Namespace != namespace {
		t.Errorf("DaemonSet %s/%s, want %s/%s", ds.Namespace, ds.Name, namespace, release)
	}
	if ds.Spec.Selector == nil || !selects(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the pod template's labels %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v dnsPolicy %q, want true, ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil {
		t.Fatalf("securityContext %+v: want privileged false, allowPrivilegeEscalation false, readOnlyRootFilesystem true, capabilities", sc)
	}
	var add []string
	for _, c := range sc.Capabilities.Add {
		add = append(add, string(c))
	}
	if !slices.Equal(add, caps) || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("capabilities add %v drop %v, want add %v drop [ALL]", add, sc.Capabilities.Drop, caps)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil || !slices.Equal(c.ReadinessProbe.Exec.Command, []string{"/usr/bin/bypassctl", "topics"}) {
		t.Errorf("readinessProbe %+v, want exec bypassctl topics", c.ReadinessProbe)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want a CPU request and a memory limit", c.Resources)
	}
	if m := spec.Volumes; len(m) == 0 || m[0].HostPath == nil || m[0].HostPath.Type == nil || *m[0].HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("volumes %+v: want the run directory as hostPath DirectoryOrCreate first", m)
	}
	if len(c.VolumeMounts) == 0 || c.VolumeMounts[0].MountPath != "/run/bypassd" {
		t.Errorf("mounts %+v: want the run directory at /run/bypassd", c.VolumeMounts)
	}
	port, _ := strings.CutPrefix(c.Args[slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--metrics-addr=") })], "--metrics-addr=:")
	if len(c.Ports) != 1 || fmt.Sprint(c.Ports[0].ContainerPort) != port || ds.Spec.Template.Annotations["prometheus.io/port"] != port {
		t.Errorf("metrics port: args %s, container ports %+v, annotation %q", port, c.Ports, ds.Spec.Template.Annotations["prometheus.io/port"])
	}
	checkDocumentedOptions(t, c.Args)
	return c
}

// checkDocumentedOptions: every option the chart passes is in
// docs/configuration.md's tables, so a renamed option cannot go unnoticed.
func checkDocumentedOptions(t *testing.T, args []string) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(?:-[a-z]`, `)?(--[a-z0-9-]+)").FindAllSubmatch(doc, -1) {
		known[string(m[1])] = true
	}
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if !known[name] {
			t.Errorf("option %s is not documented in docs/configuration.md", name)
		}
	}
}

// checkDashboard: the dashboard ConfigMap holds the dashboard
// (dashboards/bypassd.json in the chart; docs/grafana/bypassd.json links to
// it) as valid JSON.
func checkDashboard(t *testing.T, r *rendered) {
	t.Helper()
	cm, ok := r.configMaps[release+"-dashboard"]
	if !ok {
		t.Fatal("no dashboard ConfigMap")
	}
	want, err := os.ReadFile("../../docs/grafana/bypassd.json")
	if err != nil {
		t.Fatal(err)
	}
	got := cm.Data["bypassd.json"]
	if !bytes.Equal(bytes.TrimSpace([]byte(got)), bytes.TrimSpace(want)) || !json.Valid([]byte(got)) {
		t.Errorf("dashboard ConfigMap holds %d bytes, not docs/grafana/bypassd.json (%d bytes)", len(got), len(want))
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels %v lack grafana_dashboard", cm.Labels)
	}
}

// TestSystemdSameCapabilities: the unit grants the set the chart does.
func TestSystemdSameCapabilities(t *testing.T) {
	b, err := os.ReadFile("../systemd/bypassd.service")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range leastPrivilege {
		want = append(want, "CAP_"+c)
	}
	for _, key := range []string{"CapabilityBoundingSet=", "AmbientCapabilities="} {
		m := regexp.MustCompile("(?m)^" + key + "(.*)$").FindSubmatch(b)
		if m == nil || !slices.Equal(strings.Fields(string(m[1])), want) {
			t.Errorf("bypassd.service %s%s, want %s", key, m, strings.Join(want, " "))
		}
	}
}

// selects reports whether every key of sel has its value in labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestClientExamples: deploy/k8s/client-examples.yaml decodes strictly into
// Pods that can reach the default chart's daemon: node network, the socket
// directory, the socket group, no capabilities; the preload pod's
// LD_PRELOAD names the library where the image volume puts it (the
// Containerfile's /usr/lib/bypassd/libbypassd.so).
func TestClientExamples(t *testing.T) {
	b, err := os.ReadFile("../k8s/client-examples.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cf, err := os.ReadFile("../image/Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(cf, []byte(" /usr/lib/bypassd/libbypassd.so\n")) {
		t.Fatal("the Containerfile no longer puts libbypassd.so in /usr/lib/bypassd: fix the example's subPath")
	}
	preload := 0
	for _, doc := range strings.Split(string(b), "\n---") {
		var p corev1.Pod
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			t.Fatalf("client example does not decode strictly: %v\n%s", err, doc)
		}
		if p.Kind != "Pod" || !p.Spec.HostNetwork || p.Spec.SecurityContext == nil ||
			!slices.Contains(p.Spec.SecurityContext.SupplementalGroups, 65532) {
			t.Errorf("%s: want a Pod with hostNetwork and supplementalGroups [65532]", p.Name)
		}
		vols := map[string]corev1.Volume{}
		for _, v := range p.Spec.Volumes {
			vols[v.Name] = v
		}
		for _, c := range p.Spec.Containers {
			if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Add) != 0 ||
				!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("%s: want capabilities drop [ALL] and none added", p.Name)
			}
			mounts := map[string]corev1.VolumeMount{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = m
			}
			run, ok := mounts["/run/bypassd"]
			if hp := vols[run.Name].HostPath; !ok || hp == nil || hp.Path != "/run/bypassd" {
				t.Errorf("%s: /run/bypassd is not the host's /run/bypassd", p.Name)
			}
			for _, e := range c.Env {
				if e.Name != "LD_PRELOAD" {
					continue
				}
				preload++
				m, ok := mounts[filepath.Dir(e.Value)]
				iv := vols[m.Name].Image
				if !ok || iv == nil || filepath.Base(e.Value) != "libbypassd.so" || m.SubPath != "usr/lib/bypassd" ||
					!strings.HasPrefix(iv.Reference, "localhost/bypassd:") {
					t.Errorf("%s: LD_PRELOAD=%s is not libbypassd.so from an image volume of the bypassd image's usr/lib/bypassd (mount %+v, volume %+v)", p.Name, e.Value, m, vols[m.Name])
				}
			}
		}
	}
	if preload != 1 {
		t.Errorf("%d containers set LD_PRELOAD, want 1", preload)
	}
}
