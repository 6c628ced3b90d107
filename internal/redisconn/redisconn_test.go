package redisconn

import (
	"strings"
	"testing"
)

func TestParseForms(t *testing.T) {
	t.Parallel()
	o, err := Parse("redis://:pw@127.0.0.1:6380/4?pool_size=7")
	if err != nil || o.Kind != Single || o.single.Addr != "127.0.0.1:6380" || o.single.DB != 4 || o.single.Password != "pw" || o.single.PoolSize != 7 {
		t.Fatalf("single: %+v %v", o.single, err)
	}

	o, err = Parse("redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2/mymaster/2?sentinel_password=sp&sentinel_username=su&read_timeout=2s&pool_size=9")
	if err != nil {
		t.Fatal(err)
	}
	f := o.failover
	if o.Kind != Sentinel || f.MasterName != "mymaster" || f.DB != 2 || f.Username != "app" || f.Password != "s@cret" ||
		f.SentinelUsername != "su" || f.SentinelPassword != "sp" || f.ReadTimeout.String() != "2s" || f.PoolSize != 9 || f.TLSConfig != nil {
		t.Fatalf("sentinel: %+v", f)
	}
	if got := strings.Join(f.SentinelAddrs, ","); got != "10.0.0.1:26379,10.0.0.2:6379" {
		t.Fatalf("sentinel addrs %s", got)
	}

	o, err = Parse("rediss+cluster://:pw@n1:7000,n2:7001,[::1]:7002?dial_timeout=3")
	if err != nil {
		t.Fatal(err)
	}
	c := o.cluster
	if o.Kind != Cluster || c.Password != "pw" || c.TLSConfig == nil || c.TLSConfig.ServerName != "n1" || c.DialTimeout.String() != "3s" {
		t.Fatalf("cluster: %+v", c)
	}
	if got := strings.Join(c.Addrs, ","); got != "n1:7000,n2:7001,[::1]:7002" {
		t.Fatalf("cluster addrs %s", got)
	}
	if _, ok := o.AsynqConnOpt().MakeRedisClient().(interface{ Close() error }); !ok {
		t.Fatal("MakeRedisClient does not return a client")
	}
}

func TestParseErrorsNameTheProblemNotThePassword(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, want string }{
		{"127.0.0.1:6379", "not a URL"},
		{"http://h:1", `got "http"`},
		{"redis+raft://h:1", `got "redis+raft"`},
		{"redis://:topsecret@h:port/0", "not a valid URL"},
		{"redis:///0", "must name a host"},
		{"redis+sentinel://:topsecret@h:1,h:2", "must name the master"},
		{"redis+sentinel://:topsecret@h:1/m/1/2", "/MASTER_NAME or /MASTER_NAME/db"},
		{"redis+sentinel://h:1,,h:2/m", "empty address"},
		{"redis+sentinel://h:1/m?bogus=1", "bogus"},
		{"redis+cluster://:topsecret@h:1/5", "only database 0"},
		{"redis+cluster://h:99999", "no valid port"},
	} {
		_, err := Parse(c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "topsecret") {
			t.Errorf("Parse(%q) = %v, want an error with %q and no password", c.url, err, c.want)
		}
	}
}
