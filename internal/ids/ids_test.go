package ids

import (
	"crypto/rand"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// newAt returns a new id of the type prefix stamped with t, as New does.
func newAt(prefix string, t time.Time) string {
	return prefix + strings.ToLower(ulid.MustNew(ulid.Timestamp(t), rand.Reader).String())
}

func TestIDsSortByTimeAndAreUnique(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var got []string
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := newAt(Job, base.Add(time.Duration(i)*time.Millisecond))
		if seen[id] {
			t.Fatalf("duplicate id %s", id)
		}
		seen[id] = true
		if !Valid(Job, id) {
			t.Fatalf("%s is not valid", id)
		}
		got = append(got, id)
	}
	if !sort.StringsAreSorted(got) {
		t.Fatal("ids made later do not sort later")
	}
	if Valid(Batch, got[0]) || Valid(Job, "job_short") || Valid(Job, "job_"+"IIIIIIIIIIIIIIIIIIIIIIIIII") {
		t.Fatal("Valid accepted a malformed id")
	}
}

// Ids made in one process sort in the order they were made, within a
// millisecond too.
func TestNewIsMonotonic(t *testing.T) {
	t.Parallel()
	prev := New(Key)
	for range 10_000 {
		id := New(Key)
		if id <= prev {
			t.Fatalf("%s made after %s sorts before it", id, prev)
		}
		prev = id
	}
}
