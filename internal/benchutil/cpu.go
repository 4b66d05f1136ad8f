package benchutil

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU is the processor time spent by this process (the benchmark with
// everything it runs in-process: clients, sidecars, harness, app) and by
// the RabbitMQ node on the same machine (0 when it cannot be found).
//
// Waited is not processor time but the machine's CPU pressure: the time in
// which at least one runnable task waited for a processor
// (/proc/pressure/cpu, "some"; 0 where the kernel has no PSI). Beside a
// run's elapsed time it says how contended the shared cores were, which
// is what a tail latency on them mostly measures.
type CPU struct {
	Self, Broker time.Duration
	Waited       time.Duration
}

// Sub is c minus an earlier sample.
func (c CPU) Sub(earlier CPU) CPU {
	return CPU{Self: c.Self - earlier.Self, Broker: c.Broker - earlier.Broker, Waited: c.Waited - earlier.Waited}
}

// SampleCPU reads the counters: getrusage for this process,
// /proc/PID/stat of the broker's Erlang VM (beam.smp), and the CPU
// pressure.
func SampleCPU() CPU {
	c := CPU{Waited: cpuWaited()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.Self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if pid := brokerPID(); pid != "" {
		c.Broker = procCPU(pid)
	}
	return c
}

// PeakRSS is the peak resident memory of this process and of the broker
// node, in bytes (0 when unknown).
func PeakRSS() (self, broker int64) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		self = ru.Maxrss * 1024 // kilobytes on Linux
	}
	if pid := brokerPID(); pid != "" {
		broker = procHWM(pid)
	}
	return self, broker
}

// brokerPID finds the RabbitMQ node's Erlang VM among the processes: the
// node on the default AMQP port, not one of another test's nodes on this
// host (hack/rabbitmq-cluster.sh's, on ports of their own), whatever the
// order of their process ids.
func brokerPID() string {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	other := ""
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || !bytes.HasPrefix(comm, []byte("beam.smp")) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		if !bytes.Contains(cmd, []byte("rabbit")) {
			continue
		}
		env, _ := os.ReadFile(filepath.Join(d, "environ"))
		if onDefaultPort(env) {
			return filepath.Base(d)
		}
		if other == "" {
			other = filepath.Base(d)
		}
	}
	return other
}

// onDefaultPort reports whether a node's environment (/proc/PID/environ)
// leaves it on the default AMQP port 5672.
func onDefaultPort(environ []byte) bool {
	for v := range bytes.SplitSeq(environ, []byte{0}) {
		if port, ok := bytes.CutPrefix(v, []byte("RABBITMQ_NODE_PORT=")); ok {
			return string(port) == "5672"
		}
	}
	return true
}

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procCPU is utime+stime of /proc/PID/stat (0 when unreadable).
func procCPU(pid string) time.Duration {
	n, err := strconv.Atoi(pid)
	if err != nil {
		return 0
	}
	d, _ := ProcessCPU(n)
	return d
}

// ProcessCPU is the user+sys time process pid has used so far
// (/proc/PID/stat, in clock ticks).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name in %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * clockTick, nil
}

// RSS is the resident memory of this process now (VmRSS), in bytes (0
// when unknown).
func RSS() int64 { return procStatus("self", "VmRSS:") }

// procHWM is VmHWM of /proc/PID/status.
func procHWM(pid string) int64 { return procStatus(pid, "VmHWM:") }

// procStatus reads a field in kB of /proc/PID/status, in bytes.
func procStatus(pid, field string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// pressureFile is the kernel's CPU pressure stall information.
const pressureFile = "/proc/pressure/cpu"

// cpuWaited is the "some" line's total of pressureFile: microseconds in
// which some runnable task waited for a processor, since boot.
func cpuWaited() time.Duration {
	b, err := os.ReadFile(pressureFile)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if !strings.HasPrefix(line, "some ") {
		return 0
	}
	for f := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(f, "total="); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return time.Duration(us) * time.Microsecond
			}
		}
	}
	return 0
}
