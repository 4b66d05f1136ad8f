package main

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// initCommand is the hidden subcommand the runner starts each container
// with. The runner starts it in new mount and UTS namespaces; it joins the
// pod's network namespace, sets the hostname, bind-mounts the volumes,
// makes the root filesystem read-only when asked, drops to the container's
// user and execs the program. It reports a failure before the exec on fd 4,
// as runc does, so the runner can tell "could not start" from "exited".
const initCommand = "__container-init"

// initSpec is what the runner hands the init on fd 3.
type initSpec struct {
	NetNS        string      `json:"netns"`
	Hostname     string      `json:"hostname"`
	Mounts       []mountSpec `json:"mounts"`
	ReadOnlyRoot bool        `json:"readOnlyRoot"`
	UID          int         `json:"uid"`
	GID          int         `json:"gid"`
	Groups       []int       `json:"groups"`
	NoNewPrivs   bool        `json:"noNewPrivs"`
	WorkingDir   string      `json:"workingDir"`
	// Binary is the local file run; Argv[0] is the path the image holds it at.
	Binary string   `json:"binary"`
	Argv   []string `json:"argv"`
	Env    []string `json:"env"`
}

type mountSpec struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
}

func containerInit() {
	// Namespaces that setns changes are per thread: stay on this one until exec.
	runtime.LockOSThread()
	// Neither pipe may reach the program: the error pipe closing on exec is
	// how the runner learns that the exec worked.
	unix.CloseOnExec(3)
	unix.CloseOnExec(4)
	errPipe := os.NewFile(4, "errpipe")
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if errPipe != nil {
			_, _ = errPipe.WriteString(msg)
		}
		fmt.Fprintln(os.Stderr, "pod runner: "+msg)
		os.Exit(128)
	}
	raw, err := io.ReadAll(os.NewFile(3, "spec"))
	if err != nil {
		fail("read container spec: %v", err)
	}
	var s initSpec
	if err := json.Unmarshal(raw, &s); err != nil {
		fail("decode container spec: %v", err)
	}
	if err := enterContainer(&s); err != nil {
		fail("%v", err)
	}
	// Open the program as root (its directory may not be searchable by the
	// container's user), then exec it through /proc/self/fd after dropping
	// privileges, so the kernel checks only the file's own execute bits.
	bin, err := os.Open(s.Binary)
	if err != nil {
		fail("exec: %q: %v", s.Argv[0], err)
	}
	if err := dropPrivileges(&s); err != nil {
		fail("%v", err)
	}
	if s.WorkingDir != "" {
		if err := os.Chdir(s.WorkingDir); err != nil {
			fail("chdir to working directory %q: %v", s.WorkingDir, err)
		}
	}
	if s.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fail("set no_new_privs: %v", err)
		}
	}
	err = syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", bin.Fd()), s.Argv, s.Env)
	fail("exec %q: %v", s.Argv[0], err)
}

func enterContainer(s *initSpec) error {
	if s.NetNS != "" {
		f, err := os.Open(s.NetNS)
		if err != nil {
			return fmt.Errorf("open network namespace: %w", err)
		}
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("join network namespace %s: %w", s.NetNS, err)
		}
		_ = f.Close()
	}
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	// The runner created the mount points (on the host, where they stay as
	// empty directories or files). Mounts are private to this namespace:
	// Go's exec made / recursively private when it unshared it.
	for _, m := range s.Mounts {
		if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mount %s at %s: %w", m.Source, m.Target, err)
		}
		if m.ReadOnly {
			if err := unix.Mount("", m.Target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("remount %s read-only: %w", m.Target, err)
			}
		}
	}
	if s.ReadOnlyRoot {
		// Changes only this namespace's copy of the root mount.
		if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount / read-only: %w", err)
		}
	}
	return nil
}

func dropPrivileges(s *initSpec) error {
	groups := slices.Clone(s.Groups)
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(s.GID); err != nil {
		return fmt.Errorf("setgid %d: %w", s.GID, err)
	}
	if err := syscall.Setuid(s.UID); err != nil {
		return fmt.Errorf("setuid %d: %w", s.UID, err)
	}
	return nil
}

// fileGID is the group owning a file.
func fileGID(info fs.FileInfo) int {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int(st.Gid)
	}
	return -1
}
