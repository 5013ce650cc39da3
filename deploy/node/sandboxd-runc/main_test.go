package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestBundleOf(t *testing.T) {
	cases := map[string][]string{
		"/b":  {"--root", "/run/x", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "p", "id"},
		"/c":  {"run", "--bundle=/c", "id"},
		"":    {"--root", "/r", "start", "id"},
		"/d":  {"--debug", "create", "-b", "/d", "id"},
		"/e2": {"--systemd-cgroup", "create", "--bundle", "/e2", "id"},
	}
	for want, args := range cases {
		if got := bundleOf(args); got != want {
			t.Errorf("bundleOf(%v) = %q, want %q", args, got, want)
		}
	}
}

func writeSpec(t *testing.T, spec map[string]any) string {
	dir := t.TempDir()
	data, _ := json.Marshal(spec)
	path := filepath.Join(dir, "config.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func readSpec(t *testing.T, path string) map[string]any {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestWorkspaceBecomesALimitedTmpfs(t *testing.T) {
	path := writeSpec(t, map[string]any{
		"ociVersion":  "1.0.2",
		"annotations": map[string]any{annotationFiles: "64", annotationBytes: "8388608", "other": "kept"},
		"process":     map[string]any{"user": map[string]any{"uid": 1000, "gid": 1000}},
		"mounts": []any{
			map[string]any{"destination": "/proc", "type": "proc", "source": "proc"},
			map[string]any{"destination": "/workspace", "type": "bind", "source": "/var/lib/kubelet/x", "options": []any{"rbind"}},
		},
	})
	if err := patch(path, false); err != nil {
		t.Fatal(err)
	}
	spec := readSpec(t, path)
	mounts := spec["mounts"].([]any)
	want := map[string]any{
		"destination": "/workspace", "type": "tmpfs", "source": "tmpfs",
		"options": []any{"rw", "nosuid", "nodev", "mode=0755", "nr_inodes=64", "size=8388608", "uid=1000", "gid=1000"},
	}
	if !reflect.DeepEqual(mounts[1], want) {
		t.Errorf("workspace mount = %v, want %v", mounts[1], want)
	}
	if mounts[0].(map[string]any)["type"] != "proc" || spec["annotations"].(map[string]any)["other"] != "kept" {
		t.Errorf("the rest of the spec changed: %v", spec)
	}
}

func TestOtherContainersPassThrough(t *testing.T) {
	original := map[string]any{"mounts": []any{map[string]any{"destination": "/workspace", "type": "bind"}}}
	path := writeSpec(t, original)
	if err := patch(path, false); err != nil {
		t.Fatal(err)
	}
	if got := readSpec(t, path); !reflect.DeepEqual(got, map[string]any{"mounts": []any{map[string]any{"destination": "/workspace", "type": "bind"}}}) {
		t.Errorf("spec changed: %v", got)
	}
}

func TestBadAnnotationsRefuseToStart(t *testing.T) {
	for _, files := range []string{"lots", "0", "-5"} {
		path := writeSpec(t, map[string]any{
			"annotations": map[string]any{annotationFiles: files},
			"mounts":      []any{map[string]any{"destination": "/workspace"}},
		})
		if err := patch(path, false); err == nil {
			t.Errorf("max-files %q accepted", files)
		}
	}
}

func TestThePodsOtherContainersPassThrough(t *testing.T) {
	// The pause container gets the Pod's annotations too, and has no workspace.
	spec := map[string]any{"annotations": map[string]any{annotationFiles: "10"}, "mounts": []any{}}
	path := writeSpec(t, spec)
	if err := patch(path, false); err != nil {
		t.Fatal(err)
	}
	if got := readSpec(t, path); !reflect.DeepEqual(got, spec) {
		t.Errorf("spec changed: %v", got)
	}
}

func TestPidsBecomeAnNprocLimitUnderGvisorOnly(t *testing.T) {
	spec := map[string]any{
		"annotations": map[string]any{annotationPids: "64"},
		"process": map[string]any{"rlimits": []any{
			map[string]any{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024},
			map[string]any{"type": "RLIMIT_NPROC", "hard": 9999, "soft": 9999},
		}},
	}
	path := writeSpec(t, spec)
	if err := patch(path, false); err != nil {
		t.Fatal(err)
	}
	if got := readSpec(t, path); !reflect.DeepEqual(got, readSpec(t, writeSpec(t, spec))) {
		t.Errorf("runc spec changed: %v", got)
	}
	if err := patch(path, true); err != nil {
		t.Fatal(err)
	}
	want := []any{
		map[string]any{"type": "RLIMIT_NPROC", "hard": 64.0, "soft": 64.0},
		map[string]any{"type": "RLIMIT_NOFILE", "hard": 1024.0, "soft": 1024.0},
	}
	if got := readSpec(t, path)["process"].(map[string]any)["rlimits"]; !reflect.DeepEqual(got, want) {
		t.Errorf("rlimits = %v, want %v", got, want)
	}
}

func TestBadPidsRefuseToStartUnderGvisor(t *testing.T) {
	for _, pids := range []string{"many", "0", "-1"} {
		path := writeSpec(t, map[string]any{
			"annotations": map[string]any{annotationPids: pids},
			"process":     map[string]any{},
		})
		if err := patch(path, true); err == nil {
			t.Errorf("pids %q accepted", pids)
		}
	}
}

func TestShimStartPrintsTheBareAddress(t *testing.T) {
	cases := map[string]string{
		`{"version":2,"address":"unix:///run/containerd/s/ab","protocol":"ttrpc"}` + "\n": "unix:///run/containerd/s/ab",
		"unix:///run/containerd/s/cd\n":                          "unix:///run/containerd/s/cd\n",
		`{"version":3,"address":"unix:///x","protocol":"ttrpc"}`: `{"version":3,"address":"unix:///x","protocol":"ttrpc"}`,
		`{"version":2,"address":"unix:///x","protocol":"grpc"}`:  `{"version":2,"address":"unix:///x","protocol":"grpc"}`,
	}
	for out, want := range cases {
		if got := string(startAddress([]byte(out))); got != want {
			t.Errorf("startAddress(%q) = %q, want %q", out, got, want)
		}
	}
}
