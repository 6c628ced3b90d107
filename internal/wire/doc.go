// Package wire owns every object llmq puts on the wire. It renders the
// store's jobs, batches, batch output lines, files, tenants, keys and usage
// into the types of package client (the API's answers and the webhooks'
// deliveries are the same objects), writes the one error shape
// {"error":{"message","type","code","param"}}, and names the priorities.
//
// The types themselves are package client's, so the Go client reads what
// the server writes with the same definitions; the API decodes its request
// bodies into client's params types where their fields are the body's.
package wire
