package api

import (
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/wire"
)

// The admin token works as the password of basic auth, which a browser
// sends by itself once the operator has logged in to the dashboard: any
// page the operator opens could then make the browser send requests with
// it. A browser says where a request comes from (Sec-Fetch-Site, Origin);
// what reaches the admin token from another site is refused, and admin
// writes must be JSON, which no plain form or cross-site fetch can send
// without a CORS preflight llmq never grants.

var errCrossSite = wire.Errorf(http.StatusForbidden, wire.TypePermission, client.CodeCrossSiteRequest, "",
	"Cross-site request refused: the admin API, the dashboard and the monitor answer requests from their own pages and from programs, not from other sites' pages.")

// IsCrossSite reports whether a browser sent r for a page of another site
// (or another origin of the same site). A top-level navigation that only
// reads (a link to the dashboard in a runbook) is not refused. Requests
// that are not a browser's (curl, Prometheus, the Go client) carry neither
// header and pass.
func IsCrossSite(r *http.Request) bool {
	safe := r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return false
	case "":
		// A browser too old to send Sec-Fetch-Site still sends Origin on
		// cross-origin writes.
	default: // cross-site, same-site, or a value no browser sends
		dest := r.Header.Get("Sec-Fetch-Dest")
		return !(safe && r.Header.Get("Sec-Fetch-Mode") == "navigate" && (dest == "document" || dest == ""))
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return true // "null": a sandboxed frame, a file, a redirect across origins
	}
	return !strings.EqualFold(u.Host, r.Host)
}

// checkAdminRequest refuses a cross-site request and an admin write whose
// body is not declared JSON (a bodiless POST or DELETE needs no type).
func checkAdminRequest(r *http.Request) error {
	if IsCrossSite(r) {
		return errCrossSite
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return wire.Errorf(http.StatusUnsupportedMediaType, wire.TypeInvalidRequest, client.CodeUnsupportedMediaType, "Content-Type",
			"Admin requests with a body must be JSON: send 'Content-Type: application/json' (got '%.100s').", ct)
	}
	return nil
}
