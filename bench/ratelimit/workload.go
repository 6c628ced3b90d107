package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/llmq/llmq/internal/llm"
)

// model is the one model every scenario calls.
const model = "gpt-4o-mini"

// shape is a request mix: prompts of PromptMin–PromptMax one-token words,
// max_tokens uniform in MaxMin–MaxMax, and the simulator's completions
// uniform in completionMin–completionMax of max_tokens.
type shape struct {
	PromptMin, PromptMax int
	MaxMin, MaxMax       int
}

// The mixes: the usual one reserves ~530 tokens per request on average and
// uses ~410 (prompt + completion); the long one, for the provider that
// counts prompts with another tokenizer, is mostly prompt (~1,210 tokens as
// llmq estimates it) with little max_tokens (20–100), so that the prompt's
// count decides what a call costs.
var (
	usualShape = shape{PromptMin: 40, PromptMax: 400, MaxMin: 100, MaxMax: 500}
	longShape  = shape{PromptMin: 800, PromptMax: 1600, MaxMin: 20, MaxMax: 100}
)

const completionMin, completionMax = 0.2, 1.0

// promptOverhead bounds the tokens llmq's estimator adds to a prompt's
// words (the chat message's framing).
const promptOverhead = 16

// maxRequest bounds what one request of the shape asks of the provider's
// token bucket (prompt with its overhead, counted factor times, plus
// max_tokens).
func (s shape) maxRequest(factor float64) int64 {
	return int64(math.Ceil(float64(s.PromptMax+promptOverhead)*factor)) + int64(s.MaxMax)
}

// words are common English words of one token each in o200k_base, so a
// prompt of n words is about n tokens.
var words = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his from at which
but have an had they you were their one all we can her has there been if more when will would who so no out up into
do time only new some could these two may first then its over such than other also after most made well many them
our where any work should like see very way just each much good long make day year data model system request limit
token queue worker plan text result answer value order state light world house water place point group number part line`)

// request is one call of the mix.
type request struct {
	index int
	// endpoint is llm.EndpointChat or llm.EndpointResponses; body is a
	// request of that endpoint.
	endpoint string
	body     []byte
	// promptTokens is llmq's estimate of the prompt (the admission
	// estimator's, with the message overhead); cost is what the local
	// baseline reserves, and llmq's limiter before any calibration:
	// promptTokens + maxTokens.
	promptTokens int64
	maxTokens    int64
	cost         int64
	// contentTokens is the prompt without the framing, what the simulator
	// counts (times its prompt factor).
	contentTokens int64
}

// mix draws the i-th request of a run the same way in every scenario of a
// shape, so all of them send the same requests in the same order. A share
// of them (responses, 0 to 1) goes to the Responses API: the same words as
// its input, max_tokens as its max_output_tokens; which ones is drawn after
// the words and max_tokens, so every share sends the same prompts.
type mix struct {
	seed      uint64
	shape     shape
	responses float64
	est       *llm.Estimator
}

func newMix(seed uint64, s shape, responses float64) *mix {
	return &mix{seed: seed, shape: s, responses: responses, est: llm.NewEstimator()}
}

func (m *mix) request(i int) (*request, error) {
	s := m.shape
	rng := rand.New(rand.NewPCG(m.seed, uint64(i)))
	n := s.PromptMin + rng.IntN(s.PromptMax-s.PromptMin+1)
	var b strings.Builder
	for k := range n {
		if k > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	maxTokens := int64(s.MaxMin + rng.IntN(s.MaxMax-s.MaxMin+1))
	endpoint, fields := llm.EndpointChat, map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": b.String()}},
		"max_tokens": maxTokens,
	}
	if rng.Float64() < m.responses {
		endpoint, fields = llm.EndpointResponses, map[string]any{
			"model":             model,
			"input":             b.String(),
			"max_output_tokens": maxTokens,
		}
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	p, err := m.est.Parse(endpoint, model, "", body)
	if err != nil {
		return nil, fmt.Errorf("request %d: %w", i, err)
	}
	return &request{index: i, endpoint: endpoint, body: body, promptTokens: p.PromptTokens, maxTokens: maxTokens,
		cost: p.PromptTokens + maxTokens, contentTokens: p.ContentTokens}, nil
}

// describe summarises the first requests of the mix: what llmq estimates,
// and what a provider counting prompts factor times charges at admission
// (prompt + max_tokens) and uses (prompt + completion). A few hundred are
// enough for the means and cheap to tokenize, long prompts too.
func (m *mix) describe(factor float64) string {
	const n = 200
	var prompt, counted, maxTok int64
	for i := range n {
		r, err := m.request(i)
		if err != nil {
			return err.Error()
		}
		prompt += r.promptTokens
		counted += int64(math.Ceil(float64(r.contentTokens) * factor))
		maxTok += r.maxTokens
	}
	meanPrompt, meanCounted, meanMax := float64(prompt)/n, float64(counted)/n, float64(maxTok)/n
	meanCompletion := meanMax * (completionMin + completionMax) / 2
	s := fmt.Sprintf("prompt %d-%d words, max_tokens %d-%d, completion %.0f-%.0f%% of max_tokens; means of the first %d requests: prompt %.0f tokens as llmq estimates, max_tokens %.0f",
		m.shape.PromptMin, m.shape.PromptMax, m.shape.MaxMin, m.shape.MaxMax, completionMin*100, completionMax*100, n, meanPrompt, meanMax)
	if factor != 1 {
		s += fmt.Sprintf(", prompt %.0f as the provider counts it (%gx)", meanCounted, factor)
	}
	return s + fmt.Sprintf("; the provider charges %.0f tokens at admission, and a call's usage (prompt + completion) is ~%.0f",
		meanCounted+meanMax, meanCounted+meanCompletion)
}
