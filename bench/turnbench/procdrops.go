package turnbench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// UDPDrops is the kernel's counts of datagrams dropped on the UDP sockets
// process pid holds open, by socket inode: the drops column of
// /proc/net/udp and /proc/net/udp6 for the inodes of its socket
// descriptors. It reads the same counter for coturn as for ours (which
// also exports it in /metrics), so the two are compared alike. A socket
// closed before the call takes its count with it: read while the
// allocations under test are still open, and compare two readings with
// DropsSince.
type UDPDrops map[string]uint64

// DropsSince is the drops from before to d: per socket open at d, its
// count less its count in before (all of it for a socket opened since).
// Sockets closed meanwhile are not in d and count nothing, so a count
// never goes negative when one closes between the readings.
func (d UDPDrops) DropsSince(before UDPDrops) uint64 {
	var n uint64
	for ino, c := range d {
		if b, ok := before[ino]; ok && b <= c {
			n += c - b
		} else if !ok {
			n += c
		}
	}
	return n
}

// Total sums the counts.
func (d UDPDrops) Total() uint64 {
	var n uint64
	for _, c := range d {
		n += c
	}
	return n
}

// ProcessUDPDrops reads UDPDrops for process pid.
func ProcessUDPDrops(pid int) (UDPDrops, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, fmt.Errorf("turnbench: drops: %w", err)
	}
	inodes := make(map[string]bool, len(fds))
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	drops := make(UDPDrops, len(inodes))
	for _, table := range []string{"udp", "udp6"} {
		// The process's own view: its network namespace's sockets.
		if err := udpTableDrops(fmt.Sprintf("/proc/%d/net/%s", pid, table), inodes, drops); err != nil {
			return nil, err
		}
	}
	return drops, nil
}

// udpTableDrops reads the drops column of a /proc/net/udp-format table
// into drops for the rows whose inode is in inodes. Columns: sl local rem
// st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops.
func udpTableDrops(file string, inodes map[string]bool, drops UDPDrops) error {
	f, err := os.Open(file)
	if err != nil {
		if os.IsNotExist(err) {
			return nil // no IPv6
		}
		return fmt.Errorf("turnbench: drops: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 13 || !inodes[fields[9]] {
			continue
		}
		n, err := strconv.ParseUint(fields[12], 10, 64)
		if err != nil {
			return fmt.Errorf("turnbench: drops: %s: bad drops column %q", file, fields[12])
		}
		drops[fields[9]] = n
	}
	return sc.Err()
}
