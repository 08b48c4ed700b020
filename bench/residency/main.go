// Command residency says which of a running process's memory is its own
// binary's pages and which is anonymous, for bench/memory.sh: of each of the
// binary's mapped segments, how much is resident, and how the resident text
// falls into 64 KB windows (the kernel maps a file's pages around each fault,
// fault_around_bytes, 64 KB by default: a window is then resident whole or
// not at all, so one call into a package maps its neighbours too).
// Usage: residency PID
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
)

const page = 4096

type mapping struct {
	start, end uint64
	perm       string
}

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: residency PID")
	}
	pid, err := strconv.Atoi(os.Args[1])
	if err != nil {
		log.Fatalf("PID %q: %v", os.Args[1], err)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		log.Fatal(err)
	}
	maps, err := binaryMappings(pid, exe)
	if err != nil {
		log.Fatal(err)
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		log.Fatal(err)
	}
	defer pm.Close()
	var fileKB, textFull, textPart, textNone uint64
	for _, m := range maps {
		present, err := presentPages(pm, m)
		if err != nil {
			log.Fatal(err)
		}
		n := uint64(0)
		for _, p := range present {
			if p {
				n++
			}
		}
		fileKB += n * page / 1024
		fmt.Printf("  binary %s: %6d of %6d KB resident\n", m.perm, n*page/1024, (m.end-m.start)/1024)
		if !strings.Contains(m.perm, "x") {
			continue
		}
		const w = 16 // 64 KB of 4 KB pages
		first := int(m.start / page % w)
		for s := -first; s < len(present); s += w {
			c, all := 0, 0
			for i := max(s, 0); i < min(s+w, len(present)); i++ {
				all++
				if present[i] {
					c++
				}
			}
			switch {
			case c == 0:
				textNone++
			case c == all:
				textFull++
			default:
				textPart++
			}
		}
	}
	anon, err := smapsRollup(pid, "Anonymous:")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("  the binary's pages %d KB, anonymous %d KB\n", fileKB, anon)
	fmt.Printf("  text in 64 KB windows: %d resident whole, %d in part, %d not at all\n", textFull, textPart, textNone)
}

// binaryMappings are the process's mappings of its own executable.
func binaryMappings(pid int, exe string) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("maps line %q", sc.Text())
		}
		out = append(out, mapping{start: a, end: b, perm: fields[1]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no mapping of %s in /proc/%d/maps", exe, pid)
	}
	return out, sc.Err()
}

// presentPages reads bit 63 (present) of each page's pagemap entry.
func presentPages(pm *os.File, m mapping) ([]bool, error) {
	n := (m.end - m.start) / page
	buf := make([]byte, n*8)
	if _, err := pm.ReadAt(buf, int64(m.start/page*8)); err != nil {
		return nil, fmt.Errorf("pagemap: %w", err)
	}
	out := make([]bool, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(buf[i*8:])>>63 == 1
	}
	return out, nil
}

func smapsRollup(pid int, key string) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in smaps_rollup", key)
}
