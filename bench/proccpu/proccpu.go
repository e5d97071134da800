// Package proccpu is what the out-of-process benchmarks share to measure
// one server core's worth of work: a process's CPU time from
// /proc/<pid>/stat, and pinning processes to cores (a child through
// taskset, this process by setting the affinity of each of its threads).
//
// A server pinned to one core and a load generator pinned to another keep
// the load generator's own cost out of the server's figure; dividing the
// work done by the server's CPU time over the same window gives work per
// server CPU-second, which compares two servers fairly even when the load
// generator, not the server, sets the pace.
package proccpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go runs on. A measurement window of a
// second is thus good to one percent.
const clockTick = 100

// CPUTime is the user plus system CPU time process pid has used so far,
// all its threads (living and exited) together.
func CPUTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("proccpu: CPU time of %d: %w", pid, err)
	}
	return parseStat(raw)
}

// parseStat reads utime and stime (fields 14 and 15) of a stat line. The
// command name, field 2, is in parentheses and may hold spaces and
// parentheses itself, so the fields are counted from the last ')'.
func parseStat(raw []byte) (time.Duration, error) {
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, errors.New("proccpu: malformed /proc stat")
	}
	f := strings.Fields(s[i+2:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, errors.New("proccpu: short /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proccpu: malformed /proc stat times %q %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * time.Second / clockTick, nil
}

// CanPin reports whether this machine can pin a server and a load
// generator to separate cores: two cores or more, taskset on PATH (for
// children) and affinity calls that work (for this process). The error
// says what is missing.
func CanPin() error {
	if runtime.NumCPU() < 2 {
		return fmt.Errorf("proccpu: %d core: nothing to pin apart", runtime.NumCPU())
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		return fmt.Errorf("proccpu: taskset not found: %w", err)
	}
	if _, err := getAffinity(0); err != nil {
		return err
	}
	return nil
}

// Command is argv, run pinned to core cpu through `taskset -c cpu` when
// cpu is not negative (taskset execs argv, so the child's pid is the
// program's). The child's Go runtime sizes GOMAXPROCS to the cores it may
// use, so a Go server pinned this way runs with one P.
func Command(ctx context.Context, cpu int, argv ...string) *exec.Cmd {
	if cpu >= 0 {
		argv = append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
	}
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// PinSelf moves every thread of this process to core cpu (threads started
// later inherit the affinity of the thread that starts them) and sets
// GOMAXPROCS to 1, one P for one core. The returned function puts the
// previous affinity and GOMAXPROCS back.
//
// Pinning the process it runs in is a benchmark's business only: call it
// from a program (or test) that does nothing else meanwhile.
func PinSelf(cpu int) (restore func(), err error) {
	prev, err := getAffinity(0)
	if err != nil {
		return nil, err
	}
	var mask cpuMask
	if err := mask.set(cpu); err != nil {
		return nil, err
	}
	if err := setAllThreads(&mask); err != nil {
		_ = setAllThreads(&prev)
		return nil, err
	}
	procs := runtime.GOMAXPROCS(1)
	return func() {
		runtime.GOMAXPROCS(procs)
		_ = setAllThreads(&prev)
	}, nil
}

// setAllThreads sets the affinity of every thread in /proc/self/task,
// going over the list until a pass finds no thread it had not yet set
// (a thread started during a pass by one not yet moved keeps the old set).
func setAllThreads(mask *cpuMask) error {
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		entries, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("proccpu: %w", err)
		}
		fresh := 0
		for _, e := range entries {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := setAffinity(tid, mask); err != nil {
				if errors.Is(err, errNoThread) {
					continue // it ended meanwhile
				}
				return err
			}
			done[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
	return errors.New("proccpu: threads keep appearing; affinity not settled")
}

// cpuMask is a cpu_set_t of 1,024 cores.
type cpuMask [16]uint64

func (m *cpuMask) set(cpu int) error {
	if cpu < 0 || cpu >= 64*len(m) {
		return fmt.Errorf("proccpu: core %d out of range", cpu)
	}
	m[cpu/64] |= 1 << (cpu % 64)
	return nil
}
