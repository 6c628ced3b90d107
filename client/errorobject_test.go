package client_test

import (
	"encoding/json"
	"testing"

	"github.com/llmq/llmq/client"
)

// An error's code reads as text whether it came as a string, a number or
// null, and null reads as "".
func TestErrorObjectCode(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]client.ErrorObject{
		`{"error":{"message":"m","type":"t","code":"rate_limit_exceeded","param":"model"}}`: {Message: "m", Type: "t", Code: client.CodeRateLimitExceeded, Param: "model"},
		`{"error":{"message":"m","type":"t","code":429,"param":null}}`:                      {Message: "m", Type: "t", Code: "429"},
		`{"error":{"message":"m","type":"t","code":null}}`:                                  {Message: "m", Type: "t"},
	} {
		var e client.Error
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.ErrorObject != want {
			t.Errorf("%s: read %+v (%v), want %+v", body, e.ErrorObject, err, want)
		}
	}
}
