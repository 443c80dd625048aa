package deps
import (
	_ "github.com/zeebo/xxh3"
	_ "github.com/klauspost/cpuid/v2"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/valyala/fasthttp"
	_ "github.com/valyala/fastjson"
	_ "github.com/cilium/ebpf"
	_ "github.com/openai/openai-go/v3"
	_ "go.uber.org/goleak"
	_ "gopkg.in/yaml.v3"
)
