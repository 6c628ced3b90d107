package api

import (
	"strings"
	"testing"
)

func TestKeyCacheOptionsValidate(t *testing.T) {
	t.Parallel()
	for field, o := range map[string]KeyCacheOptions{"TTL": {TTL: -1}, "MaxEntries": {MaxEntries: -1}} {
		if err := o.validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: validate() = %v, want an error naming it", field, err)
		}
	}
	o := KeyCacheOptions{}
	if err := o.validate(); err != nil || o.TTL <= 0 || o.MaxEntries <= 0 || o.Now == nil || o.Logger == nil {
		t.Errorf("defaults: %v %+v", err, o)
	}
}
