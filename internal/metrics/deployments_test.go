package metrics_test

import (
	"context"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/metrics"
)

// A model on two deployments has a row of bucket levels per deployment, and
// its scrape-time gauges one series each, told apart by the deployment.
func TestDeploymentLevels(t *testing.T) {
	t.Parallel()
	policy := strings.Replace(apptest.PolicyYAML, "  - name: text-embedding-3-small\n", `  - name: gpt-4o
    price: {input_per_mtok: 2.50, output_per_mtok: 10.00}
    max_output_tokens: 1024
    deployments:
      - {provider: sim, upstream: gpt-4o, limits: {rpm: 600, tpm: 60000}}
      - {provider: sim, upstream: gpt-4o-eu, limits: {rpm: 300, tpm: 30000}}
  - name: text-embedding-3-small
`, 1)
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, NoScheduler: true, Policy: policy})
	st := metrics.NewState(metrics.StateDeps{Policy: a.Policy, Limiter: a.Limiter, Budgets: a.Budgets, Store: a.Store}, metrics.StateOptions{})
	rows, err := st.Models(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		if r.Model == "gpt-4o" {
			got = append(got, r.Scope)
		}
	}
	if len(got) != 2 || got[0] != "sim/gpt-4o" || got[1] != "sim/gpt-4o-eu" {
		t.Fatalf("gpt-4o rows = %v, want one per deployment", got)
	}
	rec := metrics.New(metrics.Options{NoProcessMetrics: true})
	if err := rec.Register(st.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := rec.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	limits := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "llmq_limiter_bucket_limit" {
			continue
		}
		for _, m := range mf.GetMetric() {
			lbl := map[string]string{}
			for _, l := range m.GetLabel() {
				lbl[l.GetName()] = l.GetValue()
			}
			if lbl["model"] == "gpt-4o" && lbl["bucket"] == "rpm" {
				limits[lbl["deployment"]] = m.GetGauge().GetValue()
			}
		}
	}
	if limits["sim/gpt-4o"] != 600 || limits["sim/gpt-4o-eu"] != 300 {
		t.Fatalf("rpm limits by deployment = %v", limits)
	}
}
