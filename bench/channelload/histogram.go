package channelload

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: 2^subBits buckets per power of two keep
// every value within 1/2^(subBits+1) (under 1%) of the truth.
const subBits = 6

// histogram counts durations in log-linear buckets. A run may complete millions of
// frames (a benchmark's b.N), so a fixed 30 KB per phone replaces a slice holding
// every latency. Values below 2^subBits ns have a bucket each; above that, the
// bucket is the value's top subBits+1 bits.
type histogram struct {
	counts [(64 - subBits + 1) << subBits]uint64
}

func bucketOf(ns uint64) int {
	if ns < 1<<subBits {
		return int(ns)
	}
	shift := bits.Len64(ns) - subBits - 1
	return (shift+1)<<subBits | int(ns>>shift)&(1<<subBits-1)
}

// bucketMid is the middle of bucket i, the value quantile reports for it.
func bucketMid(i int) time.Duration {
	if i < 1<<subBits {
		return time.Duration(i)
	}
	shift := i>>subBits - 1
	low := uint64(i&(1<<subBits-1)|1<<subBits) << shift
	return time.Duration(min(low+(1<<shift)/2, math.MaxInt64))
}

func (h *histogram) record(d time.Duration) { h.counts[bucketOf(uint64(max(d, 0)))]++ }

func (h *histogram) merge(o *histogram) {
	for i, n := range o.counts {
		h.counts[i] += n
	}
}

func (h *histogram) count() uint64 {
	var n uint64
	for _, c := range h.counts {
		n += c
	}
	return n
}

// quantile returns the value at or below which a fraction q of the durations lie,
// or 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	total := h.count()
	if total == 0 {
		return 0
	}
	rank := max(uint64(math.Ceil(q*float64(total))), 1)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return bucketMid(i)
		}
	}
	return bucketMid(len(h.counts) - 1)
}
