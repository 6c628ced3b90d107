package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress draws on stderr the bar of sending a --jobs file (lines sent and
// refused) or of waiting for requests (done and failed), with the rate and
// the time left. The rate is that of the last rateWindow of counts seen,
// never from zero: a batch half done when the wait starts is not half done
// in an instant, and once the limiter paces the work the time left says so.
type progress struct {
	w       io.Writer
	quiet   bool
	sending bool // counts are lines sent and refused, not requests done and failed

	mu      sync.Mutex // updates come from the senders' goroutines
	bar     *progressbar.ProgressBar
	samples []sample // counts seen, oldest first, within rateWindow but one
}

type sample struct {
	at time.Time
	n  int64
}

const rateWindow = 30 * time.Second

func (p *progress) update(done, failed, total int64) {
	if p.quiet || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := min(done+failed, total)
	delta, elapsed := p.observe(time.Now(), n)
	if p.bar == nil {
		opts := []progressbar.Option{
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionShowDescriptionAtLineEnd(),
		}
		if p.sending {
			opts = append(opts, progressbar.OptionSetDescription("sending"))
		}
		p.bar = progressbar.NewOptions64(total, opts...)
	} else if p.bar.GetMax64() != total {
		p.bar.ChangeMax64(total)
	}
	head := fmt.Sprintf("done %d, failed %d", done, failed)
	if p.sending {
		head = fmt.Sprintf("sent %d, refused %d", done, failed)
	}
	_ = p.bar.Set64(n)
	p.bar.Describe(describe(head, n, total, delta, elapsed)) // last: the frame left shows both alike
}

// observe records count n seen at now and returns the requests finished
// over the last rateWindow and the time they took.
func (p *progress) observe(now time.Time, n int64) (delta int64, elapsed time.Duration) {
	p.samples = append(p.samples, sample{now, n})
	// Keep one sample at or before the window's start, as its anchor.
	for len(p.samples) > 2 && now.Sub(p.samples[1].at) >= rateWindow {
		p.samples = p.samples[1:]
	}
	first := p.samples[0]
	return n - first.n, now.Sub(first.at)
}

// describe is the text beside the bar: head (the counts), then the rate
// and the time left, where the rate is delta of the n of total in elapsed:
// "done 120, failed 3, 12.5 req/s, ETA 1m20s".
func describe(head string, n, total, delta int64, elapsed time.Duration) string {
	if n >= total {
		return head
	}
	if delta <= 0 || elapsed <= 0 {
		return head + ", ETA -"
	}
	rate := float64(delta) / elapsed.Seconds()
	eta := time.Duration(float64(total-n) / rate * float64(time.Second)).Round(time.Second)
	if rate >= 1 {
		return fmt.Sprintf("%s, %.1f req/s, ETA %v", head, rate, eta)
	}
	return fmt.Sprintf("%s, %.1f req/min, ETA %v", head, rate*60, eta)
}

// finish ends the bar's line, so what follows starts on its own.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Exit()
		fmt.Fprintln(p.w)
	}
}

// roundDuration shows d to a tenth of a second, or to the millisecond
// below a second (a re-sent file that only de-duplicates takes that long).
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

func perSecond(n int, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f/s", float64(n)/d.Seconds())
}
