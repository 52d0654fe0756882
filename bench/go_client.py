"""The Go caller: HAMi's side of the wire, timed from a Go process.

Layer: benchmark. HAMi's webhook and extender are Go; on this VM a Go client costs about half
of a Python one (docs/go-clients.md), so the ratios a Go caller sees are the ones that
matter in production. A ~60-line loop client is built here with the interop client's toolchain
(scripts/go_module.py: Debian's Go in GOPATH mode, no module proxy). It sends prepared
request bytes through a pass-through codec, so it needs no generated Go code and calls any
method: the no-op floor and Admission.CheckQuota. Without ``go`` it is skipped with a note.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

from bench.load import Budget
from bench.procs import ROOT
from bench.stats import summarize

_SOURCE = r"""
package main

import (
	"context"
	"encoding/json"
	"flag"
	"io/ioutil"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
)

type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	p := v.(*[]byte)
	*p = append((*p)[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func main() {
	addr := flag.String("addr", "", "host:port")
	method := flag.String("method", "", "/package.Service/Method")
	payloadFile := flag.String("payload", "", "file with the serialized request")
	seconds := flag.Float64("seconds", 1, "time budget")
	minCalls := flag.Int("min-calls", 20, "per caller")
	maxCalls := flag.Int("max-calls", 100000, "per caller")
	warmup := flag.Int("warmup", 100, "per caller")
	callers := flag.Int("callers", 1, "concurrent callers, one connection each")
	flag.Parse()
	payload := []byte{}
	if *payloadFile != "" {
		data, err := ioutil.ReadFile(*payloadFile)
		if err != nil {
			panic(err)
		}
		payload = data
	}
	conns := make([]*grpc.ClientConn, *callers)
	for k := range conns {
		conn, err := grpc.Dial(*addr, grpc.WithInsecure(), grpc.WithBlock())
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		conns[k] = conn
	}
	call := func(conn *grpc.ClientConn) error {
		reply := []byte{}
		request := payload
		return conn.Invoke(context.Background(), *method, &request, &reply,
			grpc.ForceCodec(rawCodec{}))
	}
	for _, conn := range conns {
		for i := 0; i < *warmup; i++ {
			if err := call(conn); err != nil {
				panic(err)
			}
		}
	}
	latencies := make([][]int64, *callers)
	errors := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	started := time.Now()
	deadline := started.Add(time.Duration(*seconds * float64(time.Second)))
	for k, conn := range conns {
		wg.Add(1)
		go func(k int, conn *grpc.ClientConn) {
			defer wg.Done()
			for len(latencies[k]) < *maxCalls &&
				(len(latencies[k]) < *minCalls || time.Now().Before(deadline)) {
				t := time.Now()
				if err := call(conn); err != nil {
					mu.Lock()
					errors++
					mu.Unlock()
					continue
				}
				latencies[k] = append(latencies[k], time.Since(t).Nanoseconds())
			}
		}(k, conn)
	}
	wg.Wait()
	wall := time.Since(started).Seconds()
	all := []int64{}
	for _, l := range latencies {
		all = append(all, l...)
	}
	json.NewEncoder(os.Stdout).Encode(map[string]interface{}{
		"latencies_ns": all, "wall_s": wall, "errors": errors,
	})
}
"""


class GoUnavailable(RuntimeError):
    """The Go toolchain (or a Debian Go package) is missing; the message says how to get it."""


def _build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("go_module", ROOT / "scripts" / "go_module.py")
    if spec is None or spec.loader is None:
        raise GoUnavailable("scripts/go_module.py is missing")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(work_dir: Path, package: str, source: str) -> Path:
    """Builds a one-file Go program with the interop client's toolchain; returns the binary.

    Raises:
        GoUnavailable: no Go toolchain, or the build failed.
    """
    script = _build_script()
    try:
        script.check_toolchain()
    except script.ToolchainMissing as missing:
        raise GoUnavailable(str(missing)) from None
    gopath = Path(tempfile.mkdtemp(prefix="gopath-", dir=work_dir))
    source_dir = gopath / "src" / package
    source_dir.mkdir(parents=True)
    (source_dir / "main.go").write_text(source)
    binary = gopath / "bin" / package
    built = subprocess.run(["go", "build", "-o", str(binary), package],
                           cwd=ROOT, env=script.go_environment(gopath), capture_output=True,
                           text=True, check=False)
    if built.returncode != 0:
        raise GoUnavailable(f"go build failed: {built.stderr.strip()}")
    return binary


class GoCaller:
    """The built Go loop client; ``run`` times one method like ``bench.load.run``."""

    def __init__(self, work_dir: Path) -> None:
        self.binary = build(work_dir, "hamibench", _SOURCE)
        self._work_dir = work_dir

    def run(self, target: str, method: str, payload: bytes, budget: Budget,
            callers: int = 1) -> dict[str, float]:
        payload_file = self._work_dir / f"go-payload-{abs(hash(method))}.bin"
        payload_file.write_bytes(payload)
        done = subprocess.run(
            [str(self.binary), "-addr", target, "-method", method,
             "-payload", str(payload_file), "-seconds", str(budget.seconds),
             "-min-calls", str(max(1, budget.min_calls // callers)),
             "-max-calls", str(max(1, budget.max_calls // callers)),
             "-warmup", str(budget.warmup_calls), "-callers", str(callers)],
            capture_output=True, text=True, check=False, timeout=budget.seconds * 10 + 60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"go caller failed: {done.stderr.strip()[-2000:]}")
        data = json.loads(done.stdout)
        summary = summarize(data["latencies_ns"], data["wall_s"])
        summary["errors"] = data["errors"]
        return summary
