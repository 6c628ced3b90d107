package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/llmq/llmq/internal/cmdline"
	"github.com/llmq/llmq/internal/config"
)

const healthcheckUsage = `usage: dispatcher healthcheck [-worker]
  Asks the llmq process on this machine's LLMQ_LISTEN_ADDR whether it is
  ready (GET /readyz) and exits 0 if it is, 1 if not: the container
  healthcheck of an image with no shell. Without LLMQ_LISTEN_ADDR it probes
  the dispatcher's default address (:8080), or with -worker the worker's
  (:8081).`

// healthcheck fails unless GET /readyz on LLMQ_LISTEN_ADDR answers 200.
func healthcheck(ctx context.Context, args, environ []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	worker := fs.Bool("worker", false, "")
	if err := cmdline.Parse(fs, args, stdout, healthcheckUsage); err != nil {
		return err
	}
	env, err := config.LoadEnv(environ)
	if err != nil {
		return err
	}
	addr := env.ListenAddr
	if addr == "" {
		role := config.RoleDispatcher
		if *worker {
			role = config.RoleWorker
		}
		addr = config.DefaultListenAddr(role)
	}
	url, err := readyzURL(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp.Body.Close() // the status is the answer
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s answered %s", url, resp.Status)
	}
	fmt.Fprintln(stdout, "ready")
	return nil
}

// readyzURL is the /readyz URL of a server listening on addr: a wildcard
// or missing host is probed on loopback.
func readyzURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("LLMQ_LISTEN_ADDR: must be host:port, got %q", addr)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}
