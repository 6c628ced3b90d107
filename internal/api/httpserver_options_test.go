package api

import (
	"net/http"
	"strings"
	"testing"
)

// A bad option is an error naming the field, and no server.
func TestServerOptionsValidate(t *testing.T) {
	t.Parallel()
	srv, err := NewHTTPServer(http.NotFoundHandler(), ServerOptions{BodyStall: -1})
	if err == nil || srv != nil || !strings.Contains(err.Error(), "ServerOptions.BodyStall") {
		t.Fatalf("NewHTTPServer: %v, %v; want an error naming ServerOptions.BodyStall", srv, err)
	}
}
