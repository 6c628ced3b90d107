package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/llmq/llmq/internal/llm"
)

// model is the one model every scenario calls.
const model = "gpt-4o-mini"

// The request mix: prompts of promptWordsMin–promptWordsMax one-token words,
// max_tokens uniform in maxTokensMin–maxTokensMax, and the simulator's
// completions uniform in completionMin–completionMax of max_tokens. A
// request reserves ~530 tokens on average and keeps ~410 once the unused
// part of max_tokens is refunded.
const (
	promptWordsMin, promptWordsMax = 40, 400
	maxTokensMin, maxTokensMax     = 100, 500
	completionMin, completionMax   = 0.2, 1.0
	// maxRequestTokens bounds what one request reserves (prompt with its
	// message overhead, plus max_tokens).
	maxRequestTokens = promptWordsMax + 16 + maxTokensMax
)

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
	body  []byte
	// promptTokens is llmq's estimate of the prompt (the admission
	// estimator's, with the message overhead); cost is what llmq's limiter
	// and the local baseline reserve: promptTokens + maxTokens.
	promptTokens int64
	maxTokens    int64
	cost         int64
}

// mix draws the i-th request of a run the same way in every scenario, so
// all scenarios send the same requests in the same order.
type mix struct {
	seed uint64
	est  *llm.Estimator
}

func newMix(seed uint64) *mix { return &mix{seed: seed, est: llm.NewEstimator()} }

func (m *mix) request(i int) (*request, error) {
	rng := rand.New(rand.NewPCG(m.seed, uint64(i)))
	n := promptWordsMin + rng.IntN(promptWordsMax-promptWordsMin+1)
	var b strings.Builder
	for k := range n {
		if k > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	maxTokens := int64(maxTokensMin + rng.IntN(maxTokensMax-maxTokensMin+1))
	body, err := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": b.String()}},
		"max_tokens": maxTokens,
	})
	if err != nil {
		return nil, err
	}
	prompt, err := m.est.PromptTokens(llm.EndpointChat, model, "", body)
	if err != nil {
		return nil, fmt.Errorf("request %d: %w", i, err)
	}
	return &request{index: i, body: body, promptTokens: prompt, maxTokens: maxTokens, cost: prompt + maxTokens}, nil
}

// describe summarises the first requests of the mix.
func (m *mix) describe() string {
	const n = 2000
	var prompt, maxTok, cost int64
	for i := range n {
		r, err := m.request(i)
		if err != nil {
			return err.Error()
		}
		prompt += r.promptTokens
		maxTok += r.maxTokens
		cost += r.cost
	}
	meanCompletion := float64(maxTok) / n * (completionMin + completionMax) / 2
	return fmt.Sprintf("prompt %d-%d words (mean %.0f tokens as llmq estimates), max_tokens %d-%d (mean %.0f), completion %.0f-%.0f%% of max_tokens; reserved %.0f and kept ~%.0f tokens per request on average",
		promptWordsMin, promptWordsMax, float64(prompt)/n, maxTokensMin, maxTokensMax, float64(maxTok)/n,
		completionMin*100, completionMax*100, float64(cost)/n, float64(prompt)/n+meanCompletion)
}
