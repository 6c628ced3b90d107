// Package money holds USD amounts as integer micro-dollars and per-token
// prices, so that spend never rounds through floats, and the default price
// table a policy's prices override.
package money

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
)

// Micros is an amount of US dollars in millionths of a dollar.
type Micros int64

// PerDollar is the number of Micros in one dollar.
const PerDollar Micros = 1_000_000

// maxUSD bounds amounts read from configuration and clients.
const maxUSD = 1e9

// FromUSD converts a dollar amount to Micros, rounding to the nearest
// micro-dollar. It refuses negative, non-finite and absurdly large amounts.
func FromUSD(usd float64) (Micros, error) {
	switch {
	case math.IsNaN(usd) || math.IsInf(usd, 0):
		return 0, fmt.Errorf("%v is not a number of dollars", usd)
	case usd < 0:
		return 0, fmt.Errorf("%v is negative", usd)
	case usd > maxUSD:
		return 0, fmt.Errorf("%v is more than %v dollars", usd, maxUSD)
	}
	return Micros(math.Round(usd * float64(PerDollar))), nil
}

// USD returns m in dollars, for display and JSON only.
func (m Micros) USD() float64 { return float64(m) / float64(PerDollar) }

// String formats m as dollars with six decimals, e.g. "1.234567".
func (m Micros) String() string {
	sign := ""
	v := int64(m)
	if v < 0 {
		sign, v = "-", -v
	}
	return fmt.Sprintf("%s%d.%06d", sign, v/1_000_000, v%1_000_000)
}

// Price is what a model costs, in Micros per one million tokens.
type Price struct {
	InputPerMTok       Micros
	OutputPerMTok      Micros
	CachedInputPerMTok Micros // prompt tokens read from the cache; 0 means the input price
	// CacheWrite5mPerMTok and CacheWrite1hPerMTok are the prices of prompt
	// tokens written to the provider's cache for five minutes and for the
	// hour (Anthropic's); 0 means the input price (see Anthropic).
	CacheWrite5mPerMTok Micros
	CacheWrite1hPerMTok Micros
	// BatchInputPerMTok and BatchOutputPerMTok are the prices on the
	// provider's Batch API; 0 means half the normal price.
	BatchInputPerMTok  Micros
	BatchOutputPerMTok Micros
	// ServiceTiers are the prices of the service tiers sold beside the
	// standard one ("flex", "priority").
	ServiceTiers map[string]Price
	// AutoTier is the service tier a call naming none (or "auto") is
	// served at; "" is the standard tier.
	AutoTier string
	// Tools are the prices of the provider's built-in tools by kind.
	Tools map[string]ToolPrice
}

// ToolPrice is what a built-in tool costs beyond the model's tokens.
type ToolPrice struct {
	PerCall Micros
	// ResultTokens is the most tokens one call's result adds to the model's
	// next turn; 0 when unknown, and the context window bounds it.
	ResultTokens int64
}

// StandardTier names a call at the standard price, a provider's default
// service tier.
const StandardTier = "default"

// Tier is the price of a call served at service tier name (the standard
// price for "" or StandardTier), with the tools' prices; ok is false when
// the deployment sells no such tier.
func (p Price) Tier(name string) (Price, bool) {
	if name == "" || name == StandardTier {
		return p, true
	}
	t, ok := p.ServiceTiers[name]
	if !ok {
		return Price{}, false
	}
	t.Tools = p.Tools
	return t, true
}

// Batch is the price of a call run on the provider's Batch API: the batch
// prices, else half the normal ones (rounded up), cached tokens and cache
// writes at half.
func (p Price) Batch() Price {
	half := func(m Micros) Micros { return m/2 + m%2 }
	input := cmp.Or(p.BatchInputPerMTok, half(p.InputPerMTok))
	return Price{InputPerMTok: input, OutputPerMTok: cmp.Or(p.BatchOutputPerMTok, half(p.OutputPerMTok)),
		CachedInputPerMTok:  min(half(p.CachedInputPerMTok), input),
		CacheWrite5mPerMTok: half(p.CacheWrite5mPerMTok), CacheWrite1hPerMTok: half(p.CacheWrite1hPerMTok), Tools: p.Tools}
}

// Anthropic is p with Anthropic's prompt-caching prices where p gives
// none, each rounded up to the micro-dollar per 1M tokens: cache writes at
// 1.25 times the input price for five minutes and 2 times for the hour,
// cache reads at 0.1 times. Its service tiers' prices alike.
func (p Price) Anthropic() Price {
	in := p.InputPerMTok
	p.CacheWrite5mPerMTok = cmp.Or(p.CacheWrite5mPerMTok, (in*5+3)/4)
	p.CacheWrite1hPerMTok = cmp.Or(p.CacheWrite1hPerMTok, 2*in)
	p.CachedInputPerMTok = cmp.Or(p.CachedInputPerMTok, (in+9)/10)
	if len(p.ServiceTiers) > 0 {
		tiers := make(map[string]Price, len(p.ServiceTiers))
		for name, t := range p.ServiceTiers {
			tiers[name] = t.Anthropic()
		}
		p.ServiceTiers = tiers
	}
	return p
}

// Tokens are what one call is billed for: its prompt (Cached of it read
// from the provider's cache, CacheWrite5m and CacheWrite1h of it written to
// the cache for five minutes and for the hour, the rest plain input) and
// its completion.
type Tokens struct {
	Prompt, Cached, Completion int64
	CacheWrite5m, CacheWrite1h int64
}

// Cost is the price of one call of tokens t, rounded up so a job is never
// charged less than it cost. The prompt's parts are taken within it, in
// the order cached, written for five minutes, written for the hour.
func (p Price) Cost(t Tokens) Micros {
	prompt := max(t.Prompt, 0)
	cached := min(max(t.Cached, 0), prompt)
	w5 := min(max(t.CacheWrite5m, 0), prompt-cached)
	w1 := min(max(t.CacheWrite1h, 0), prompt-cached-w5)
	in := p.InputPerMTok
	var num int64
	for _, term := range [][2]int64{
		{prompt - cached - w5 - w1, int64(in)},
		{cached, int64(cmp.Or(p.CachedInputPerMTok, in))},
		{w5, int64(cmp.Or(p.CacheWrite5mPerMTok, in))},
		{w1, int64(cmp.Or(p.CacheWrite1hPerMTok, in))},
		{t.Completion, int64(p.OutputPerMTok)},
	} {
		var ok bool
		if num, ok = mulAdd(num, term[0], term[1]); !ok {
			return math.MaxInt64 // no budget holds it: whatever asked for it is refused
		}
	}
	if num <= 0 {
		return 0
	}
	return Micros(num/1_000_000 + min(num%1_000_000, 1))
}

// mulAdd is acc + n×price (a negative term counts as 0), and false when the
// sum passes what an int64 holds.
func mulAdd(acc, n, price int64) (int64, bool) {
	if n <= 0 || price <= 0 {
		return acc, true
	}
	hi, lo := bits.Mul64(uint64(n), uint64(price))
	if hi != 0 || lo > math.MaxInt64 || int64(lo) > math.MaxInt64-acc {
		return 0, false
	}
	return acc + int64(lo), true
}

// WorstCase is the most a call can cost: every prompt token at the
// dearest price a prompt token has (plain input, read from the cache or
// written to it) and maxOutput completion tokens.
func (p Price) WorstCase(prompt, maxOutput int64) Micros {
	t := Tokens{Prompt: prompt, Completion: maxOutput}
	switch max(p.InputPerMTok, p.CachedInputPerMTok, p.CacheWrite5mPerMTok, p.CacheWrite1hPerMTok) {
	case p.InputPerMTok:
	case p.CacheWrite1hPerMTok:
		t.CacheWrite1h = prompt
	case p.CacheWrite5mPerMTok:
		t.CacheWrite5m = prompt
	default:
		t.Cached = prompt
	}
	return p.Cost(t)
}

func usd(input, output, cached float64) Price {
	m := func(f float64) Micros { v, _ := FromUSD(f); return v }
	return Price{InputPerMTok: m(input), OutputPerMTok: m(output), CachedInputPerMTok: m(cached)}
}

// claude is an Anthropic model's list price: input and output, its cache
// writes and reads at Anthropic's multiples of the input price.
func claude(input, output float64) Price { return usd(input, output, 0).Anthropic() }

// DefaultPrices are list prices (USD per 1M tokens) of common models, for a
// model whose policy entry gives no price.
var DefaultPrices = map[string]Price{
	"gpt-4o":                 usd(2.50, 10.00, 1.25),
	"gpt-4o-mini":            usd(0.15, 0.60, 0.075),
	"gpt-4.1":                usd(2.00, 8.00, 0.50),
	"gpt-4.1-mini":           usd(0.40, 1.60, 0.10),
	"gpt-4.1-nano":           usd(0.10, 0.40, 0.025),
	"o3":                     usd(2.00, 8.00, 0.50),
	"o3-mini":                usd(1.10, 4.40, 0.55),
	"o4-mini":                usd(1.10, 4.40, 0.275),
	"gpt-3.5-turbo":          usd(0.50, 1.50, 0),
	"text-embedding-3-small": usd(0.02, 0, 0),
	"text-embedding-3-large": usd(0.13, 0, 0),
	"text-embedding-ada-002": usd(0.10, 0, 0),
	"claude-opus-4-1":        claude(15, 75),
	"claude-opus-4-5":        claude(5, 25),
	"claude-sonnet-4-5":      claude(3, 15),
	"claude-sonnet-4-0":      claude(3, 15),
	"claude-haiku-4-5":       claude(1, 5),
	"claude-3-5-haiku":       claude(0.80, 4),
}
