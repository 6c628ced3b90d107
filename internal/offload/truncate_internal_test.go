package offload

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A provider's string is cut at a character's boundary, never inside one.
func TestTruncateKeepsUTF8(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc"},
		{"héllo", 2, "h"}, // é is two bytes: cut before it
		{strings.Repeat("€", 5), 7, "€€"},
		{"a\xffb", 3, "a\xffb"}, // within the bound: as given
	} {
		got := truncate(c.in, c.n)
		if got != c.want || (len(c.in) > c.n && !utf8.ValidString(got)) {
			t.Errorf("truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
