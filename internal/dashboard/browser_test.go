package dashboard_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/queue"
)

// artifacts is where the screenshots go (gitignored), from this package.
const artifacts = "../../test/artifacts"

// chromium finds the browser, or fails the test with the one line that
// says how to get it: a browser test that skips proves nothing.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: install it with `apt-get install -y chromium` (scripts/test does), or set TEST_CHROMIUM to a Chrome binary")
	return ""
}

// browser starts a headless Chromium with a fresh profile that sends the
// admin token (as basic auth, as a browser after its login prompt) with
// every request and never reaches outside the machine.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	profile, err := os.MkdirTemp("", "llmq-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Chromium's helpers can still write to the profile a moment after
		// the browser exits.
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1400, 1000),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(ctx)
	t.Cleanup(cancelTab)

	err = chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		// asynqmon's page links Google's fonts: nothing may download.
		if _, err := cdp.Call(ctx, tg, network.SetBlockedURLs, network.SetBlockedURLsParams{URLPatterns: []*network.BlockPattern{
			{URLPattern: "https://fonts.googleapis.com/*", Block: true},
			{URLPattern: "https://fonts.gstatic.com/*", Block: true},
		}}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
			Headers: network.Headers{"Authorization": basic(apptest.AdminToken)},
		})
		return err
	}))
	if err != nil {
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	return ctx
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		t.Fatal(err)
	}
	path, _ := filepath.Abs(filepath.Join(artifacts, name))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

func TestDashboardInABrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t) // first: without a browser, fail before seeding anything
	f := setup(t)

	if err := chromedp.Do(ctx, chromedp.Navigate(f.url+"/dashboard"),
		chromedp.WaitVisible(chromedp.CSS(`[data-tenant="`+f.acme+`"]`))); err != nil {
		t.Fatalf("load /dashboard: %v", err)
	}
	screenshot(t, ctx, "dashboard.png")

	// Spend against budget, with the soft mark passed.
	acme := `[data-tenant="` + f.acme + `"]`
	for sel, want := range map[string]string{
		acme + " .spent":                         "$41.25",
		acme + " .budget":                        "$50.00",
		acme + " .remaining":                     "$8.75",
		acme + " .badge":                         "soft",
		`[data-tenant="` + f.beta + `"] .spent`:  "$12.50",
		`[data-tenant="` + f.beta + `"] .budget`: "$500.00",
		`[data-tenant="` + f.beta + `"] .badge`:  "ok",
	} {
		if got := text(t, ctx, sel); got != want {
			t.Errorf("%s = %q, want %q", sel, got, want)
		}
	}
	// The budget days raised to the ledger in the last hour.
	if got := text(t, ctx, `#budget-raised`); got != "Days raised to the ledger, last hour: 1, adding $0.4600 Redis had lost" {
		t.Errorf("budget days raised: %q", got)
	}
	soft, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(acme+" .mark.soft"), "style"))
	if err != nil || !strings.Contains(soft.Value, "left:80.0%") {
		t.Errorf("soft mark of acme: %+v, %v; want it at 80%%", soft, err)
	}

	// The model's daily bucket: 4,000,000 of 10,000,000 taken, refilling
	// ~116 tokens a second since.
	bucket := text(t, ctx, `[data-model="gpt-4o-mini"] [data-bucket="tpd"] .remaining`)
	rem, lim, ok := strings.Cut(bucket, " / ")
	n, err := strconv.ParseInt(strings.ReplaceAll(rem, ",", ""), 10, 64)
	if !ok || err != nil || lim != "10,000,000" || n < 5_999_800 || n > 6_020_000 {
		t.Errorf("tpd bucket shows %q; want about 6,000,000 / 10,000,000", bucket)
	}
	if got := text(t, ctx, `[data-model="gpt-4o-mini"] .rate429`); !strings.HasPrefix(got, "25.0%") {
		t.Errorf("429 rate shows %q, want 25.0%% (1 of 4 calls)", got)
	}
	// What the buckets learned from the provider's answers.
	for sel, want := range map[string]string{
		`[data-model="gpt-4o-mini"] [data-bucket="tpm"] .provider`: "provider: 4,900,000 left",
		`[data-model="gpt-4o-mini"] [data-learned="calibration"]`:  "prompts counted ×1.25 (median of 3 calls)",
		`[data-model="gpt-4o-mini"] [data-learned="refund:tpm"]`:   "tpm: refunds not seen yet",
		`[data-model="gpt-4o-mini"] [data-learned="burst:tpm"]`:    "tpm: at most 1m0s of refill at once",
		`[data-model="gpt-4o-mini"] .unpredicted`:                  "1 unpredicted",
	} {
		if got := text(t, ctx, sel); !strings.HasPrefix(got, want) {
			t.Errorf("%s = %q, want it to start %q", sel, got, want)
		}
	}

	// Batch progress.
	batch := `[data-batch="` + f.batch + `"]`
	if got := text(t, ctx, batch+" .progress"); got != "7 / 10" {
		t.Errorf("batch progress %q, want 7 / 10", got)
	}
	width, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(batch+" .fill"), "style"))
	if err != nil || !strings.Contains(width.Value, "width:70.0%") {
		t.Errorf("progress bar: %+v, %v; want 70%% wide", width, err)
	}

	// Queues and the last hour.
	if got := text(t, ctx, `[data-queue="jobs"] .pending`); got != "3" {
		t.Errorf("jobs queue pending %q, want 3", got)
	}
	for tile, want := range map[string]string{"jobs": "4", "tokens": "4,800", "spend": "$1.00", "429": "25.0%"} {
		if got := text(t, ctx, `[data-tile="`+tile+`"] .value`); got != want {
			t.Errorf("last-hour tile %s = %q, want %q", tile, got, want)
		}
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#charts svg polyline").length`)); err != nil || n < 4 {
		t.Errorf("%d chart lines, %v; want the charts drawn", n, err)
	}

	// The labels say what they count and since when: "created" names the
	// jobs it counts, a model no 429 pauses is "running" (an operator reads
	// "open" as a tripped breaker), spend is "last hour" in the tiles and
	// "today" in the tenants' table, with the time base said once.
	if got := text(t, ctx, `[data-tile="jobs"] .note`); got != "0 failed, 0 via POST /v1/jobs (batch lines not counted)" {
		t.Errorf("jobs tile note %q", got)
	}
	if got := text(t, ctx, `[data-model="gpt-4o-mini"] .state`); got != "running" {
		t.Errorf("model state %q, want running", got)
	}
	if got := text(t, ctx, `.timebase`); !strings.Contains(got, "last 60 minutes") || !strings.Contains(got, "Tenants: today") {
		t.Errorf("time base line %q", got)
	}
	if got := text(t, ctx, `[data-tile="spend"] .label`); got != "Spend, last hour" {
		t.Errorf("spend tile label %q", got)
	}
	headers, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#tenants th")].map(th => th.innerText.trim())`))
	if err != nil || len(headers) < 6 || headers[2] != "Spent today" || headers[4] != "Daily budget" {
		t.Errorf("tenant table headers %q, %v", headers, err)
	}
	// Numbers and their headers are aligned alike, to the right.
	misaligned, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table")].flatMap(tb => {
		const ths = [...tb.querySelectorAll("thead th")];
		return [...tb.querySelectorAll("tbody tr")].flatMap(tr => [...tr.children].map((td, i) =>
			td.classList.contains("num") && ths[i] && getComputedStyle(ths[i]).textAlign !== getComputedStyle(td).textAlign
				? ths[i].innerText.trim() : null)).filter(x => x);
	})`))
	if err != nil || len(misaligned) > 0 {
		t.Errorf("headers not aligned with their numbers: %q, %v", misaligned, err)
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#queues th.num").length`)); err != nil || n != 7 {
		t.Errorf("%d right-aligned queue headers, %v; want 7", n, err)
	}

	// asynqmon loads its UI under the prefix and lists the queues.
	q := f.a.Queue.Namespace().Queue(queue.Jobs)
	if err := chromedp.Do(ctx, chromedp.Navigate(f.url+"/monitoring/")); err != nil {
		t.Fatalf("load /monitoring/: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.body.innerText.includes(`+strconv.Quote(q)+`)`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("asynqmon does not list queue %s: %v\npage: %.500s", q, err, body)
	}
	screenshot(t, ctx, "monitoring.png")
}
