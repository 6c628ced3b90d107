package metrics_test

import (
	"testing"
	"time"

	"github.com/llmq/llmq/internal/metrics"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// BenchmarkRecorderJob is what the recorder adds to one job in a worker:
// the permit wait, the provider call and the finish, with the per-minute
// counters buffered (their flush runs every 5 s, off the job's path).
func BenchmarkRecorderJob(b *testing.B) {
	rdb := testutil.Redis(b, redisDB)
	rec := metrics.New(metrics.Options{Redis: rdb, Keys: rkeys.New(testutil.Prefix(b)), NoProcessMetrics: true})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec.JobState("standard", "gpt-4o-mini", "running")
			rec.LimiterWait("gpt-4o-mini", time.Millisecond, false)
			rec.ProviderCall("openai/gpt-4o-mini", "gpt-4o-mini", 200, 300*time.Millisecond)
			rec.JobFinished("ten_01abc", "standard", "gpt-4o-mini", "succeeded", 120, 40, 42)
		}
	})
}
