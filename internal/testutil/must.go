package testutil

// Must returns v, panicking on err: for constructors whose options a test
// knows are valid.
func Must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
