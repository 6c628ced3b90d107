package worker

import (
	"sync"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm"
)

// Providers holds one llm.Provider per provider of the policy in force and
// rebuilds them when the policy changes. Provider API keys are read from the
// environment variable each provider names.
type Providers struct {
	mu        sync.RWMutex
	byName    map[string]llm.Provider
	digest    string
	lookupEnv func(string) (string, bool)
}

// NewProviders returns the providers of p. lookupEnv reads API keys
// (os.LookupEnv in production).
func NewProviders(p *config.Policy, lookupEnv func(string) (string, bool)) *Providers {
	ps := &Providers{lookupEnv: lookupEnv}
	ps.Update(p)
	return ps
}

// Update rebuilds the providers when p differs from the policy they were
// built from.
func (ps *Providers) Update(p *config.Policy) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.byName != nil && p.Digest != "" && p.Digest == ps.digest {
		return
	}
	m := make(map[string]llm.Provider, len(p.Providers))
	for _, cp := range p.Providers {
		key := ""
		if cp.APIKeyEnv != "" {
			key, _ = ps.lookupEnv(cp.APIKeyEnv)
		}
		m[cp.Name] = llm.NewOpenAI(llm.OpenAIConfig{Name: cp.Name, BaseURL: cp.BaseURL, APIKey: key, Timeout: cp.Timeout,
			MaxResponseBytes: cp.MaxResponseBytes, Azure: cp.Kind == config.ProviderAzure, APIVersion: cp.APIVersion})
	}
	ps.byName, ps.digest = m, p.Digest
}

// Get returns the provider named name.
func (ps *Providers) Get(name string) (llm.Provider, bool) {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	p, ok := ps.byName[name]
	return p, ok
}
