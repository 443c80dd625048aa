package live

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// userHZ is the unit of /proc/<pid>/stat times (USER_HZ, 100 on Linux).
const userHZ = 100

// procStat is what the bench reads from /proc/<pid>/stat.
type procStat struct {
	state      byte
	ppid, pgrp int
	cpuTicks   int64 // utime + stime, all threads
	childTicks int64 // cutime + cstime (waited-for children)
}

// parseStat parses the content of /proc/<pid>/stat. The command name (field
// 2) is in parentheses and may itself hold spaces or parentheses, so fields
// are counted from the last ')'.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("stat: no command field in %q", b)
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state): ppid and pgrp are fields 4 and 5, utime..cstime
	// fields 14..17.
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("stat: %d fields after the command, want >= 15", len(f))
	}
	var v [6]int64
	for k, idx := range []int{1, 2, 11, 12, 13, 14} {
		n, err := strconv.ParseInt(string(f[idx]), 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("stat field %d: %w", idx+3, err)
		}
		v[k] = n
	}
	return procStat{state: f[0][0], ppid: int(v[0]), pgrp: int(v[1]), cpuTicks: v[2] + v[3], childTicks: v[4] + v[5]}, nil
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// treeCPU returns the CPU time used so far by pid and its live children
// (nginx: master plus workers).
func treeCPU(pid int) (time.Duration, error) {
	root, err := readStat(pid)
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	ticks := root.cpuTicks
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		child, err := strconv.Atoi(filepath.Base(d))
		if err != nil || child == pid {
			continue
		}
		st, err := readStat(child)
		if err != nil || st.ppid != pid {
			continue
		}
		ticks += st.cpuTicks
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// liveInGroup lists the processes of process group pgrp that are not
// zombies (tests: nothing a run started may outlive it).
func liveInGroup(pgrp int) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if st, err := readStat(pid); err == nil && st.pgrp == pgrp && st.state != 'Z' {
			out = append(out, pid)
		}
	}
	return out
}
