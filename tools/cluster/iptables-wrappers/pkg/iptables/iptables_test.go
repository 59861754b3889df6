package iptables

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeCommand is an iptables stand-in: each chain is a file of rules in $FAKE_IPTABLES_STATE
// named table.chain, and every call is appended to its file `calls`. It answers as iptables
// does: status 1 for a missing chain or rule, 2 for anything it does not know.
const fakeCommand = `#!/bin/sh
state="$FAKE_IPTABLES_STATE"
echo "$*" >> "$state/calls"
[ "$1" = "-w" ] && [ "$3" = "-t" ] || exit 2
table=$4; op=$5; chain=$6
shift 6
f="$state/$table.$chain"
case "$op" in
-S) [ -e "$f" ] || exit 1; cat "$f" ;;
-N) [ -e "$f" ] && exit 1; : > "$f" ;;
-C) [ -e "$f" ] || exit 1; grep -qxF -- "$*" "$f" || exit 1 ;;
-I) [ -e "$f" ] || exit 1; { echo "$*"; cat "$f"; } > "$f.new"; mv "$f.new" "$f" ;;
-A) [ -e "$f" ] || exit 1; echo "$*" >> "$f" ;;
*) exit 2 ;;
esac
`

// fake returns a client running the stand-in over a fresh state with the filter table's
// INPUT and OUTPUT chains.
func fake(t *testing.T) (*runner, string) {
	t.Helper()
	dir := t.TempDir()
	command := filepath.Join(dir, "iptables")
	if err := os.WriteFile(command, []byte(fakeCommand), 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, chain := range []string{"filter.INPUT", "filter.OUTPUT"} {
		if err := os.WriteFile(filepath.Join(state, chain), []byte("existing rule\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("FAKE_IPTABLES_STATE", state)
	return &runner{command: command, protocol: ProtocolIPv4}, state
}

func rules(t *testing.T, state, name string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(state, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func TestEnsureChainCreatesOnceAndSaysWhetherItExisted(t *testing.T) {
	r, state := fake(t)
	ctx := context.Background()
	existed, err := r.EnsureChain(ctx, TableMangle, "KUBE-IPTABLES-HINT")
	if err != nil || existed {
		t.Fatalf("first EnsureChain: existed=%v err=%v, want a new chain", existed, err)
	}
	if _, err := os.Stat(filepath.Join(state, "mangle.KUBE-IPTABLES-HINT")); err != nil {
		t.Fatalf("the chain was not created: %v", err)
	}
	existed, err = r.EnsureChain(ctx, TableMangle, "KUBE-IPTABLES-HINT")
	if err != nil || !existed {
		t.Fatalf("second EnsureChain: existed=%v err=%v, want the existing chain", existed, err)
	}
}

func TestEnsureRuleAddsAtItsPositionOnce(t *testing.T) {
	r, state := fake(t)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		existed, err := r.EnsureRule(ctx, Prepend, TableFilter, ChainOutput, "-j", "KUBE-FIREWALL")
		if err != nil || existed != (i == 1) {
			t.Fatalf("EnsureRule #%d: existed=%v err=%v", i, existed, err)
		}
		if _, err := r.EnsureRule(ctx, Append, TableFilter, ChainOutput, "-j", "DROP"); err != nil {
			t.Fatal(err)
		}
	}
	got := strings.Join(rules(t, state, "filter.OUTPUT"), "|")
	if want := "-j KUBE-FIREWALL|existing rule|-j DROP"; got != want {
		t.Fatalf("OUTPUT holds %q, want %q", got, want)
	}
}

func TestFailuresOtherThanMissingAreErrors(t *testing.T) {
	r, _ := fake(t)
	ctx := context.Background()
	// Adding to a chain that does not exist fails, as it does in iptables.
	if _, err := r.EnsureRule(ctx, Append, Table("raw"), "NOPE", "-j", "DROP"); err == nil {
		t.Fatal("a rule in a chain that does not exist was reported added")
	}
	missing := &runner{command: filepath.Join(t.TempDir(), "no-such-iptables"), protocol: ProtocolIPv4}
	if _, err := missing.EnsureChain(ctx, TableFilter, "X"); err == nil || !strings.Contains(err.Error(), "no-such-iptables") {
		t.Fatalf("a missing command gave %v, want an error naming it", err)
	}
}

func TestBestEffortSkipsFamiliesWithoutACommand(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if clients := NewBestEffort(context.Background(), UseInstalledMode); len(clients) != 0 {
		t.Fatalf("with no iptables on PATH got clients for %v", clients)
	}
}

func TestMonitorReloadsWhenACanaryIsFlushed(t *testing.T) {
	r, state := fake(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reloads := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		r.Monitor(ctx, "KUBE-KUBELET-CANARY", []Table{TableMangle, TableNAT}, func() { reloads <- struct{}{} }, 10*time.Millisecond)
		close(done)
	}()
	canary := filepath.Join(state, "nat.KUBE-KUBELET-CANARY")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(canary); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Monitor did not create its canary")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-reloads:
		t.Fatal("reloaded while every canary was there")
	case <-time.After(50 * time.Millisecond):
	}
	if err := os.Remove(canary); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reloads:
	case <-time.After(5 * time.Second):
		t.Fatal("a flushed canary did not call the reload function")
	}
	for {
		if _, err := os.Stat(canary); err == nil {
			break
		}
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("Monitor did not create the canary again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Monitor did not return when its context ended")
	}
}
