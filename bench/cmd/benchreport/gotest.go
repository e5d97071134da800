package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"edgerelay/bench/abtest"
	"edgerelay/bench/benchfmt"
)

// benchResults are parsed `go test -bench` lines.
type benchResults struct {
	// samples holds, for each benchmark (package path, then name without
	// the -GOMAXPROCS suffix), one sample per line, each mapping a unit
	// ("ns/op", "allocs/op", "frames/s") to its value. With -count=N a
	// benchmark has N samples.
	samples map[string]map[string][]map[string]float64
	// order lists each package's benchmarks as they first appeared, which
	// is the order their source declares them in.
	order map[string][]string
}

// benchLine matches "BenchmarkName-2   123456   12.3 ns/op   0 B/op ...":
// the name, an optional -procs suffix, the iteration count and the rest.
var benchLine = regexp.MustCompile(`^(Benchmark\S*?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

// parseBench reads go test output. Lines that are not benchmark results
// are skipped; the "pkg:" line before a package's benchmarks says whose
// they are.
func parseBench(r io.Reader) benchResults {
	res := benchResults{samples: map[string]map[string][]map[string]float64{}, order: map[string][]string{}}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		fields := strings.Fields(m[3])
		sample := map[string]float64{}
		for i := 0; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				break
			}
			sample[fields[i+1]] = v
		}
		if len(sample) == 0 {
			continue
		}
		if res.samples[pkg] == nil {
			res.samples[pkg] = map[string][]map[string]float64{}
		}
		if res.samples[pkg][m[1]] == nil {
			res.order[pkg] = append(res.order[pkg], m[1])
		}
		res.samples[pkg][m[1]] = append(res.samples[pkg][m[1]], sample)
	}
	return res
}

// values are unit's values over the benchmark's samples, in the order
// they ran.
func (r benchResults) values(pkg, name, unit string) []float64 {
	var v []float64
	for _, s := range r.samples[pkg][name] {
		if x, ok := s[unit]; ok {
			v = append(v, x)
		}
	}
	return v
}

// median is the median of unit over the benchmark's samples, and whether
// the benchmark reported that unit at all.
func (r benchResults) median(pkg, name, unit string) (float64, bool) {
	v := r.values(pkg, name, unit)
	return abtest.Median(v), len(v) > 0
}

// opResult is a micro benchmark's time and allocations per operation.
type opResult struct {
	ns, allocs float64   // medians
	nsValues   []float64 // every run's time, for the spread
	ok         bool      // the benchmark reported a time
}

// op is the benchmark's time and allocations per operation.
func (r benchResults) op(pkg, name string) opResult {
	ns, ok := r.median(pkg, name, "ns/op")
	allocs, _ := r.median(pkg, name, "allocs/op")
	return opResult{ns: ns, allocs: allocs, nsValues: r.values(pkg, name, "ns/op"), ok: ok}
}

// String is the median time with its spread, then the allocations:
// "7.2 ns [6.9–7.5], 0 allocs".
func (o opResult) String() string {
	return fmt.Sprintf("%s%s, %g allocs", benchfmt.Nanoseconds(o.ns), benchfmt.Spread(o.nsValues, benchfmt.Nanoseconds), o.allocs)
}

// names lists a package's benchmark names in the order they ran.
func (r benchResults) names(pkg string) []string { return r.order[pkg] }
