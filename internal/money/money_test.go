package money

import (
	"math"
	"testing"
)

func TestFromUSDAndString(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		usd  float64
		want Micros
		str  string
	}{
		{0.15, 150_000, "0.150000"},
		{50, 50_000_000, "50.000000"},
		{0.0000005, 1, "0.000001"},
		{1.1, 1_100_000, "1.100000"},
	} {
		got, err := FromUSD(c.usd)
		if err != nil || got != c.want || got.String() != c.str {
			t.Errorf("FromUSD(%v) = %d %q %v, want %d %q", c.usd, got, got.String(), err, c.want, c.str)
		}
	}
	for _, bad := range []float64{-1, 2e9} {
		if _, err := FromUSD(bad); err == nil {
			t.Errorf("FromUSD(%v) accepted", bad)
		}
	}
	if s := Micros(-1_500_000).String(); s != "-1.500000" {
		t.Errorf("negative String = %q", s)
	}
}

func TestCostRoundsUpExactly(t *testing.T) {
	t.Parallel()
	p := DefaultPrices["gpt-4o-mini"] // 0.15 in, 0.60 out, 0.075 cached per 1M
	// 1000 prompt + 500 completion = 150000*1000 + 600000*500 = 450,000,000 / 1e6 = 450 µ$ exactly.
	if got := p.Cost(1000, 0, 500); got != 450 {
		t.Fatalf("Cost = %d, want 450", got)
	}
	// 1 prompt token = 0.15 µ$ -> rounds up to 1.
	if got := p.Cost(1, 0, 0); got != 1 {
		t.Fatalf("Cost(1) = %d, want 1", got)
	}
	// 1000 cached of 1000 prompt: 75000*1000/1e6 = 75.
	if got := p.Cost(1000, 1000, 0); got != 75 {
		t.Fatalf("cached Cost = %d, want 75", got)
	}
	if got := p.WorstCase(100, 1000); got != p.Cost(100, 0, 1000) {
		t.Fatalf("WorstCase = %d", got)
	}
	if got := (Price{InputPerMTok: 1}).Cost(0, 0, 0); got != 0 {
		t.Fatalf("zero tokens cost %d", got)
	}
}

// A cost never overflows: tokens no budget could pay for cost the most
// Micros holds, never a wrapped-around negative or zero.
func TestCostSaturates(t *testing.T) {
	t.Parallel()
	p := Price{InputPerMTok: 2_500_000, OutputPerMTok: 10_000_000}
	if got := p.Cost(1_000_000_000_000_000, 0, 0); got != math.MaxInt64 {
		t.Errorf("1e15 prompt tokens cost %d, want MaxInt64", got)
	}
	if got := p.Cost(10, 0, math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("MaxInt64 completion tokens cost %d, want MaxInt64", got)
	}
	if got := p.Cost(1_000_000, 0, 1_000_000); got != 12_500_000 {
		t.Errorf("1M + 1M tokens cost %d, want 12,500,000 micros", got)
	}
	if got := p.Cost(1, 0, 0); got != 3 {
		t.Errorf("1 prompt token costs %d micros, want 3 (2.5 rounded up)", got)
	}
}
