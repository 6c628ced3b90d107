package sim

import (
	"math"
	"time"
)

// bucket is one continuously refilled token bucket, as OpenAI's limits are:
// it holds up to limit units and regains limit units per period.
type bucket struct {
	limit  int64 // 0: no such limit
	period time.Duration
	level  float64
	last   time.Time
}

func newBucket(limit int64, period time.Duration, now time.Time) bucket {
	return bucket{limit: limit, period: period, level: float64(limit), last: now}
}

// setLimit changes the capacity, keeping what the bucket holds (up to the new
// capacity), as a provider raising or lowering a limit would.
func (b *bucket) setLimit(limit int64, now time.Time) {
	b.refill(now)
	if b.limit == 0 {
		b.level = float64(limit)
	}
	b.limit = limit
	b.level = min(b.level, float64(limit))
}

func (b *bucket) rate() float64 { return float64(b.limit) / float64(b.period) } // units per ns

func (b *bucket) refill(now time.Time) {
	if b.limit == 0 {
		return
	}
	if d := now.Sub(b.last); d > 0 {
		b.level = min(float64(b.limit), b.level+float64(d)*b.rate())
		b.last = now
	}
}

// wait is how long until the bucket holds cost; ok is false when it never
// will (cost above capacity).
func (b *bucket) wait(cost int64) (d time.Duration, ok bool) {
	if b.limit == 0 {
		return 0, true
	}
	if cost > b.limit {
		return 0, false
	}
	need := float64(cost) - b.level
	if need <= 0 {
		return 0, true
	}
	return ceilMS(time.Duration(math.Ceil(need / b.rate()))), true
}

func (b *bucket) take(cost int64) {
	if b.limit != 0 {
		b.level -= float64(cost)
	}
}

func (b *bucket) give(n int64, now time.Time) {
	if b.limit != 0 {
		b.refill(now)
		b.level = min(float64(b.limit), b.level+float64(n))
	}
}

// untilFull is how long until the bucket is full again.
func (b *bucket) untilFull() time.Duration {
	if b.limit == 0 {
		return 0
	}
	return ceilMS(time.Duration(math.Ceil(max(float64(b.limit)-b.level, 0) / b.rate())))
}

func (b *bucket) remaining() int64 {
	return max(0, int64(math.Floor(b.level)))
}

// ceilMS rounds up to whole milliseconds, the precision of OpenAI's headers,
// so a client that waits the announced time finds the bucket ready.
func ceilMS(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
