package jsontext

import (
	"bytes"
	"strings"
	"testing"
)

// What Unstorable finds, where, and of what kind; what it lets through.
// (store's TestUnstorableAgreesWithPostgres holds it to Postgres itself.)
func TestUnstorable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		doc  string
		off  int // -1: nothing to find
		code string
		raw  bool
	}{
		{`{"a":"café \ud83d\ude00","n":-12.5e3}`, -1, "", false},
		{`{"a":"C:\\u0000"}`, -1, "", false}, // an escaped backslash, then "u0000"
		{`{"a":"x\u0000"}`, 7, CodeInvalidEncoding, false},
		{`{"a":"x\ud800y"}`, 7, CodeInvalidEncoding, false},
		{`{"a":"\udc00"}`, 6, CodeInvalidEncoding, false},
		{`{"a":1e200000}`, 5, CodeNumberOutOfRange, false},
		{`{"a":"1e200000"}`, -1, "", false}, // a string, not a number
		{"{\"a\":\"caf\xe9\"}", 9, CodeInvalidEncoding, true},
		{"{\"a\":\"x\x00\"}", 7, CodeInvalidEncoding, true},
		{"{\"a\":\"\\u0000\xff\"}", 12, CodeInvalidEncoding, true}, // the bytes first
	} {
		p := Unstorable([]byte(c.doc))
		switch {
		case c.off < 0 && p != nil:
			t.Errorf("%q: found %+v, want nothing", c.doc, p)
		case c.off >= 0 && (p == nil || p.Offset != c.off || p.Code != c.code || p.Raw != c.raw || p.What == ""):
			t.Errorf("%q: found %+v, want offset %d, code %s, raw %v", c.doc, p, c.off, c.code, c.raw)
		}
	}
}

// PathAt names the value that holds a byte, as an error's param does.
func TestPathAt(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"custom_id":"a","body":{"messages":[{"content":"x"},{"content":"yy"}],"n":1e200000},"k":{"r":"s"}}`)
	for _, c := range []struct {
		at   string // the first occurrence of this text in doc
		want string
	}{
		{`"a"`, "custom_id"},
		{`"yy"`, "body.messages[1].content"},
		{`1e200000`, "body.n"},
		{`"r"`, "k"}, // a member's name: its object
		{`"s"`, "k.r"},
	} {
		off := bytes.Index(doc, []byte(c.at))
		if got := PathAt(doc, off); got != c.want {
			t.Errorf("PathAt(%s) = %q, want %q", c.at, got, c.want)
		}
		if f := Field(PathAt(doc, off)); f == "" || f != Field(c.want) {
			t.Errorf("Field of %q = %q", c.want, f)
		}
	}
	if got := PathAt([]byte(`{"a":`), 3); got != "" {
		t.Errorf("a document that does not parse: %q", got)
	}
}

// A member named twice, at any depth, and nesting past MaxDepth are found,
// with the path of the object that holds them.
func TestStructure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		doc, code, path string
	}{
		{`{"model":"o3","model":"cap-raw","max_tokens":5}`, CodeDuplicateKey, ""},
		{`{"body":{"messages":[{"role":"user","content":"a","content":"b"}]}}`, CodeDuplicateKey, "body.messages[0]"},
		{`{"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":2}]}`, "", ""},
		{`{"a":"\"a\"","b":1}`, "", ""},
		{strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), "", ""},
		{`{"body":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`, CodeTooDeep, "body[0]"},
		{`{"body":{"metadata":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}}`, CodeTooDeep, "body.metadata"},
		{`not json {"a":1,"a":2}`, "", ""},
	} {
		p := Structure([]byte(c.doc))
		switch {
		case c.code == "" && p != nil:
			t.Errorf("%.60s: %+v, want none", c.doc, p)
		case c.code != "" && (p == nil || p.Code != c.code):
			t.Errorf("%.60s: %+v, want %s", c.doc, p, c.code)
		case c.code != "" && PathAt([]byte(c.doc), p.Offset) != c.path:
			t.Errorf("%.60s: %s at %q, want %q", c.doc, p.Code, PathAt([]byte(c.doc), p.Offset), c.path)
		}
	}
	if p := Structure([]byte(`{"model":"o3","model":"x"}`)); p == nil || p.What != `the member "model" a second time` {
		t.Errorf("what: %+v", p)
	}
}
