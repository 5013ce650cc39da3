package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// The containerd shim adapter: run under the name containerd-shim-runsc-v1,
// this program stands in for gVisor's shim (found beside it as gvisor-shim).
// gVisor's shim is built against containerd 2's shim library, whose "start"
// prints its bootstrap parameters as JSON ({"version":2,"address":...,
// "protocol":"ttrpc"}); containerd 1.6 (1.7 reads both) takes that output
// for the bare socket address. Version 2 over ttrpc is the task API 1.6
// speaks, so the adapter prints the address alone. Every other command (delete, and the
// shim daemon re-executing itself) goes to gVisor's shim unchanged.
const (
	shimName     = "containerd-shim-runsc-v1"
	realShimName = "gvisor-shim"
)

func shimMain(args []string) {
	real := filepath.Join(filepath.Dir(os.Args[0]), realShimName)
	if len(args) == 0 || args[len(args)-1] != "start" {
		err := syscall.Exec(real, append([]string{real}, args...), os.Environ())
		fmt.Fprintf(os.Stderr, "%s: exec %s: %v\n", shimName, real, err)
		os.Exit(127)
	}
	cmd := exec.Command(real, args...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		os.Stdout.Write(out)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.ExitCode())
		}
		fmt.Fprintf(os.Stderr, "%s: %s start: %v\n", shimName, real, err)
		os.Exit(1)
	}
	os.Stdout.Write(startAddress(out))
}

// startAddress is the socket address in a shim's "start" output: the
// address of version-2 ttrpc bootstrap parameters, or the output unchanged
// (an older shim's bare address, or something this adapter cannot read).
func startAddress(out []byte) []byte {
	var params struct {
		Version  int    `json:"version"`
		Address  string `json:"address"`
		Protocol string `json:"protocol"`
	}
	trimmed := bytes.TrimSpace(out)
	if json.Unmarshal(trimmed, &params) != nil || params.Address == "" {
		return out
	}
	if params.Version != 2 || (params.Protocol != "" && params.Protocol != "ttrpc") {
		return out
	}
	return []byte(params.Address)
}
