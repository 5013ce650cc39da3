// sandboxd-runc: an OCI runtime wrapper that gives a sandbox Pod a workspace
// the kernel limits in bytes *and* files.
//
// Kubernetes has no per-Pod inode quota, and the kubelet mounts an emptyDir
// (even medium: Memory) without nr_inodes. This wrapper sits between
// containerd's runc shim and runc (a RuntimeClass whose handler's BinaryName
// is this program). On "create" and "run" it reads the bundle's config.json;
// when the container carries the annotation sandboxd.io/max-files (passed
// through by containerd's pod_annotations), it replaces the bind mount of
// /workspace with a tmpfs of its own, mounted by runc inside the container's
// mount namespace with size= and nr_inodes=. Writes past either limit fail
// with ENOSPC; the pages count against the container's memory cgroup, as an
// emptyDir of medium Memory does. Every other container and every other
// command passes through unchanged, and then the real runc is exec'd.
//
// Run under the name sandboxd-runsc (the binary_name of gVisor's containerd
// shim), it wraps gVisor's runsc instead, and the annotation sandboxd.io/pids
// becomes RLIMIT_NPROC of every container of the Pod. gVisor counts that
// limit per user inside its own kernel, so it caps the sandbox's processes
// (fork and clone fail with EAGAIN) where the host's pids cgroup cannot: the
// host sees gVisor's own threads there, and a limit on them stops the whole
// sandbox instead of refusing one fork. The Pod's pause container gets the
// limit too because gVisor gives every exec'd process the limits of the
// Pod's first container. Under runc the same rlimit would count the user's
// processes across the whole host, so there it is left alone.
//
// Run under the name containerd-shim-runsc-v1 it is a small adapter in front
// of gVisor's containerd shim for containerd 1.6 (shim.go).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

const (
	annotationFiles = "sandboxd.io/max-files"
	annotationBytes = "sandboxd.io/disk-bytes"
	annotationPids  = "sandboxd.io/pids"
	workspace       = "/workspace"
	defaultRunc     = "/usr/bin/runc"
	gvisorName      = "sandboxd-runsc"
)

func main() {
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == shimName {
		shimMain(args)
		return
	}
	name, gvisor := "sandboxd-runc", filepath.Base(os.Args[0]) == gvisorName
	if gvisor {
		name = gvisorName
	}
	if bundle := bundleOf(args); bundle != "" {
		if err := patch(filepath.Join(bundle, "config.json"), gvisor); err != nil {
			// Refuse to start a sandbox without its limits rather than start it unlimited.
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
	}
	real, err := realRuntime(gvisor)
	if err == nil {
		err = syscall.Exec(real, append([]string{real}, args...), os.Environ())
	}
	fmt.Fprintf(os.Stderr, "%s: exec %s: %v\n", name, real, err)
	os.Exit(127)
}

// realRuntime is the runtime to exec: $SANDBOXD_RUNC (default /usr/bin/runc),
// or under gVisor $SANDBOXD_RUNSC (default: the runsc beside this program's
// path as called, then runsc on PATH).
func realRuntime(gvisor bool) (string, error) {
	if !gvisor {
		if real := os.Getenv("SANDBOXD_RUNC"); real != "" {
			return real, nil
		}
		return defaultRunc, nil
	}
	if real := os.Getenv("SANDBOXD_RUNSC"); real != "" {
		return real, nil
	}
	if beside := filepath.Join(filepath.Dir(os.Args[0]), "runsc"); filepath.IsAbs(beside) {
		if info, err := os.Stat(beside); err == nil && !info.IsDir() {
			return beside, nil
		}
	}
	return exec.LookPath("runsc")
}

// bundleOf returns the --bundle of a "create" or "run" command ("" otherwise).
// runc's global flags come before the command; the bundle defaults to the cwd.
func bundleOf(args []string) string {
	command := -1
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) > 0 && a[0] == '-' {
			if takesValue(a) {
				i++
			}
			continue
		}
		command = i
		break
	}
	if command < 0 || (args[command] != "create" && args[command] != "run") {
		return ""
	}
	for i := command + 1; i < len(args); i++ {
		a := args[i]
		switch {
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			return args[i+1]
		case len(a) > 9 && a[:9] == "--bundle=":
			return a[9:]
		}
	}
	cwd, err := os.Getwd()
	if err != nil {
		return ""
	}
	return cwd
}

// takesValue lists runc's global flags that take a separate value.
func takesValue(flag string) bool {
	switch flag {
	case "--root", "--log", "--log-format", "--criu", "--rootless":
		return true
	}
	return false
}

func patch(path string, gvisor bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	annotations, _ := spec["annotations"].(map[string]any)
	changed, err := limitFiles(spec, annotations)
	if err != nil {
		return err
	}
	if gvisor {
		limited, err := limitProcesses(spec, annotations)
		if err != nil {
			return err
		}
		changed = changed || limited
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	tmp := path + ".sandboxd"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// limitFiles replaces the workspace mount with a tmpfs of the annotated
// sizes; false when the container has no workspace or no file limit.
func limitFiles(spec, annotations map[string]any) (bool, error) {
	files, _ := annotations[annotationFiles].(string)
	if files == "" {
		return false, nil
	}
	mounts, _ := spec["mounts"].([]any)
	replaced := false
	for i, m := range mounts {
		mount, _ := m.(map[string]any)
		if mount["destination"] == workspace {
			options, err := tmpfsOptions(spec, files, annotations[annotationBytes])
			if err != nil {
				return false, err
			}
			mounts[i] = map[string]any{
				"destination": workspace, "type": "tmpfs", "source": "tmpfs", "options": options,
			}
			replaced = true
		}
	}
	// The Pod's other containers (its pause container gets the Pod's
	// annotations too) have no workspace: nothing to limit.
	return replaced, nil
}

// limitProcesses sets RLIMIT_NPROC (soft and hard) to the annotated process
// limit; false when there is none.
func limitProcesses(spec, annotations map[string]any) (bool, error) {
	pids, _ := annotations[annotationPids].(string)
	if pids == "" {
		return false, nil
	}
	n, err := strconv.ParseUint(pids, 10, 63)
	if err != nil || n == 0 {
		return false, fmt.Errorf("annotation %s=%q is not a positive number", annotationPids, pids)
	}
	process, ok := spec["process"].(map[string]any)
	if !ok {
		return false, fmt.Errorf("the container has no process to limit to %d processes", n)
	}
	limits := []any{map[string]any{"type": "RLIMIT_NPROC", "hard": n, "soft": n}}
	old, _ := process["rlimits"].([]any)
	for _, r := range old {
		if rlimit, _ := r.(map[string]any); rlimit["type"] != "RLIMIT_NPROC" {
			limits = append(limits, r)
		}
	}
	process["rlimits"] = limits
	return true, nil
}

func tmpfsOptions(spec map[string]any, files string, bytes any) ([]any, error) {
	n, err := strconv.ParseUint(files, 10, 63)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("annotation %s=%q is not a positive number", annotationFiles, files)
	}
	options := []any{"rw", "nosuid", "nodev", "mode=0755", "nr_inodes=" + strconv.FormatUint(n, 10)}
	if s, _ := bytes.(string); s != "" {
		b, err := strconv.ParseUint(s, 10, 63)
		if err != nil || b == 0 {
			return nil, fmt.Errorf("annotation %s=%q is not a positive number", annotationBytes, s)
		}
		options = append(options, "size="+strconv.FormatUint(b, 10))
	}
	// Owned by the user the container runs as, so it can write its workspace.
	if process, ok := spec["process"].(map[string]any); ok {
		if user, ok := process["user"].(map[string]any); ok {
			uid, _ := user["uid"].(float64)
			gid, _ := user["gid"].(float64)
			options = append(options, fmt.Sprintf("uid=%d", int64(uid)), fmt.Sprintf("gid=%d", int64(gid)))
		}
	}
	return options, nil
}
