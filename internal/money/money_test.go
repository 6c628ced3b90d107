package money

import (
	"math"
	"math/big"
	"math/rand/v2"
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
	if got := p.Cost(Tokens{Prompt: 1000, Completion: 500}); got != 450 {
		t.Fatalf("Cost = %d, want 450", got)
	}
	// 1 prompt token = 0.15 µ$ -> rounds up to 1.
	if got := p.Cost(Tokens{Prompt: 1, Completion: 0}); got != 1 {
		t.Fatalf("Cost(1) = %d, want 1", got)
	}
	// 1000 cached of 1000 prompt: 75000*1000/1e6 = 75.
	if got := p.Cost(Tokens{Prompt: 1000, Cached: 1000, Completion: 0}); got != 75 {
		t.Fatalf("cached Cost = %d, want 75", got)
	}
	if got := p.WorstCase(100, 1000); got != p.Cost(Tokens{Prompt: 100, Completion: 1000}) {
		t.Fatalf("WorstCase = %d", got)
	}
	if got := (Price{InputPerMTok: 1}).Cost(Tokens{Prompt: 0, Completion: 0}); got != 0 {
		t.Fatalf("zero tokens cost %d", got)
	}
}

// A cost never overflows: tokens no budget could pay for cost the most
// Micros holds, never a wrapped-around negative or zero.
func TestCostSaturates(t *testing.T) {
	t.Parallel()
	p := Price{InputPerMTok: 2_500_000, OutputPerMTok: 10_000_000}
	if got := p.Cost(Tokens{Prompt: 1_000_000_000_000_000, Completion: 0}); got != math.MaxInt64 {
		t.Errorf("1e15 prompt tokens cost %d, want MaxInt64", got)
	}
	if got := p.Cost(Tokens{Prompt: 10, Completion: math.MaxInt64}); got != math.MaxInt64 {
		t.Errorf("MaxInt64 completion tokens cost %d, want MaxInt64", got)
	}
	if got := p.Cost(Tokens{Prompt: 1_000_000, Completion: 1_000_000}); got != 12_500_000 {
		t.Errorf("1M + 1M tokens cost %d, want 12,500,000 micros", got)
	}
	if got := p.Cost(Tokens{Prompt: 1, Completion: 0}); got != 3 {
		t.Errorf("1 prompt token costs %d micros, want 3 (2.5 rounded up)", got)
	}
}

// Anthropic's prompt caching to the micro-dollar: at $3 in and $15 out per
// 1M tokens, a call of 1,000 plain input tokens, 2,000 read from the
// cache, 4,000 written for five minutes, 8,000 for the hour and 500 output
// costs 3000 + 2000×0.3 + 4000×3.75 + 8000×6 + 500×15 micros: 3000 + 600 +
// 15000 + 48000 + 7500 = 74,100.
func TestAnthropicCachePrices(t *testing.T) {
	t.Parallel()
	p := Price{InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000}.Anthropic()
	if p.CacheWrite5mPerMTok != 3_750_000 || p.CacheWrite1hPerMTok != 6_000_000 || p.CachedInputPerMTok != 300_000 {
		t.Fatalf("Anthropic() = %+v, want writes 3.75 and 6, reads 0.30 per 1M", p)
	}
	u := Tokens{Prompt: 15_000, Cached: 2000, CacheWrite5m: 4000, CacheWrite1h: 8000, Completion: 500}
	if got := p.Cost(u); got != 74_100 {
		t.Errorf("Cost = %d, want 74100", got)
	}
	// Prices the policy gives are kept, the service tiers' filled alike.
	q := Price{InputPerMTok: 10_000_000, CachedInputPerMTok: 250_000, CacheWrite1hPerMTok: 15_000_000,
		ServiceTiers: map[string]Price{"priority": {InputPerMTok: 20_000_000}}}.Anthropic()
	if q.CachedInputPerMTok != 250_000 || q.CacheWrite1hPerMTok != 15_000_000 || q.CacheWrite5mPerMTok != 12_500_000 ||
		q.ServiceTiers["priority"].CacheWrite5mPerMTok != 25_000_000 {
		t.Errorf("Anthropic() overrode a given price or missed a tier: %+v", q)
	}
	// A cache write or read never costs less than the input rounded:
	// an odd input price rounds each default up.
	if r := (Price{InputPerMTok: 7}).Anthropic(); r.CacheWrite5mPerMTok != 9 || r.CachedInputPerMTok != 1 || r.CacheWrite1hPerMTok != 14 {
		t.Errorf("Anthropic() of 7 micros = %+v, want 9, 1, 14", r)
	}
	// The Batch API halves every price, cache writes included.
	if b := p.Batch(); b.CacheWrite5mPerMTok != 1_875_000 || b.CacheWrite1hPerMTok != 3_000_000 || b.CachedInputPerMTok != 150_000 {
		t.Errorf("Batch() = %+v", b)
	}
}

// Over many generated prices and calls, Cost is the exact sum of each part
// at its price, rounded up to the micro-dollar, and WorstCase bounds the
// cost of every way the prompt may be billed.
func TestCostExactAndBounded(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(48, 1))
	for range 20_000 {
		p := Price{InputPerMTok: Micros(rng.Int64N(20_000_000)), OutputPerMTok: Micros(rng.Int64N(80_000_000))}
		if rng.IntN(2) == 0 {
			p = p.Anthropic()
		}
		if rng.IntN(3) == 0 {
			p.CachedInputPerMTok = Micros(rng.Int64N(5_000_000))
		}
		prompt := rng.Int64N(300_000)
		cached := rng.Int64N(prompt + 1)
		w5 := rng.Int64N(prompt - cached + 1)
		w1 := rng.Int64N(prompt - cached - w5 + 1)
		out := rng.Int64N(100_000)
		or := func(m Micros) int64 {
			if m == 0 {
				return int64(p.InputPerMTok)
			}
			return int64(m)
		}
		num := new(big.Int)
		for _, term := range [][2]int64{{prompt - cached - w5 - w1, int64(p.InputPerMTok)}, {cached, or(p.CachedInputPerMTok)},
			{w5, or(p.CacheWrite5mPerMTok)}, {w1, or(p.CacheWrite1hPerMTok)}, {out, int64(p.OutputPerMTok)}} {
			num.Add(num, new(big.Int).Mul(big.NewInt(term[0]), big.NewInt(term[1])))
		}
		q, r := new(big.Int).QuoRem(num, big.NewInt(1_000_000), new(big.Int))
		if r.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		got := p.Cost(Tokens{Prompt: prompt, Cached: cached, CacheWrite5m: w5, CacheWrite1h: w1, Completion: out})
		if int64(got) != q.Int64() {
			t.Fatalf("%+v: Cost(%d, %d, %d, %d, %d) = %d, want %d", p, prompt, cached, w5, w1, out, got, q.Int64())
		}
		if worst := p.WorstCase(prompt, out); worst < got {
			t.Fatalf("%+v: WorstCase(%d, %d) = %d below a cost of %d", p, prompt, out, worst, got)
		}
	}
}
