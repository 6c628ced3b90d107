package store

import (
	"encoding/json"
	"testing"
)

func TestJobErrorJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(&JobError{Message: "m", Type: "invalid_request_error"})
	if err != nil || string(b) != `{"message":"m","type":"invalid_request_error","code":null,"param":null}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	b, _ = json.Marshal(JobError{Message: "m", Type: "t", Code: "c", Param: "p"})
	var back JobError
	if err := json.Unmarshal(b, &back); err != nil || back != (JobError{Message: "m", Type: "t", Code: "c", Param: "p"}) {
		t.Fatalf("round trip of %s = %+v, %v", b, back, err)
	}
}

func TestWithoutNUL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"a":"x"}`:               `{"a":"x"}`,
		`{"a":"\u0000"}`:          `{"a":"\ufffd"}`,
		`{"a":"\\u0000"}`:         `{"a":"\\u0000"}`, // an escaped backslash, then text
		`{"a":"\\\u0000\u00001"}`: `{"a":"\\\ufffd\ufffd1"}`,
		`{"a":"\u00001"}`:         `{"a":"\ufffd1"}`,
	} {
		if got := string(withoutNUL([]byte(in))); got != want {
			t.Errorf("withoutNUL(%s) = %s, want %s", in, got, want)
		}
	}
}
