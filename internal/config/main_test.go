package config

import (
	"testing"

	"go.uber.org/goleak"
)

// Watch runs a goroutine per holder; every test must stop the ones it starts.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
