package budget

import (
	"testing"
	"time"
)

// The span kept per location answers as computing it afresh would, across
// midnights and a DST change that skips midnight (America/Santiago,
// 2026-09-06 starts at 01:00).
func TestSpanKeptAnswersAsComputed(t *testing.T) {
	t.Parallel()
	b := &Budgets{}
	for _, zone := range []string{"UTC", "Asia/Kolkata", "America/Santiago", "Pacific/Kiritimati"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Skipf("no zone data: %v", err)
		}
		from := time.Date(2026, 9, 4, 0, 0, 0, 0, time.UTC)
		for at := from; at.Before(from.Add(72 * time.Hour)); at = at.Add(17 * time.Minute) {
			if got, want := b.spanAt(at, loc), spanAt(at, loc); got != want {
				t.Fatalf("%s at %v: kept %+v, computed %+v", zone, at, got, want)
			}
		}
		// and back in time: a guess corrected by Redis's clock may go back
		at := from.Add(-time.Hour)
		if got, want := b.spanAt(at, loc), spanAt(at, loc); got != want {
			t.Fatalf("%s at %v: kept %+v, computed %+v", zone, at, got, want)
		}
	}
}
