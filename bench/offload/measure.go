package main

import (
	"context"

	"github.com/llmq/llmq/bench/internal/cost"
)

// usage is what a run costs besides time, measured as bench/pipeline
// measures it (package cost), so the two benchmarks' figures per job
// compare.
type usage struct {
	redisRT int64 // round trips of the app's Redis client
	cpu     cost.CPU
}

// meter reads a stack's usage.
type meter struct {
	rt  *cost.RoundTrips
	cpu *cost.CPUReader
}

func (m *meter) read(ctx context.Context) usage {
	return usage{redisRT: m.rt.N(), cpu: m.cpu.Read(ctx)}
}

// since is the usage from u to now.
func (m *meter) since(ctx context.Context, u usage) usage {
	now := m.read(ctx)
	return usage{redisRT: now.redisRT - u.redisRT, cpu: now.cpu.Sub(u.cpu)}
}
