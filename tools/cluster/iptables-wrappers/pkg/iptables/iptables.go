// Package iptables creates chains and rules with the iptables and ip6tables commands installed
// on the host, as the kubelet does for its KUBE-IPTABLES-HINT and KUBE-FIREWALL chains.
//
// It is kubedev's own code with the import path the kubelet uses (see this module's go.mod).
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Table is an iptables table.
type Table string

// The tables the kubelet writes to.
const (
	TableFilter Table = "filter"
	TableNAT    Table = "nat"
	TableMangle Table = "mangle"
)

// Chain is an iptables chain.
type Chain string

// Built-in chains.
const (
	ChainInput       Chain = "INPUT"
	ChainOutput      Chain = "OUTPUT"
	ChainForward     Chain = "FORWARD"
	ChainPrerouting  Chain = "PREROUTING"
	ChainPostrouting Chain = "POSTROUTING"
)

// RulePosition says where EnsureRule adds a missing rule: first in its chain or last.
type RulePosition string

// Positions of a new rule.
const (
	Prepend RulePosition = "-I"
	Append  RulePosition = "-A"
)

// Protocol is the IP family a client writes rules for.
type Protocol string

// The two families.
const (
	ProtocolIPv4 Protocol = "IPv4"
	ProtocolIPv6 Protocol = "IPv6"
)

// Mode says which iptables backend a client uses.
type Mode int

// UseInstalledMode runs `iptables` and `ip6tables` as the host installs them (legacy or nft,
// whichever the host's alternatives point to).
const UseInstalledMode Mode = 0

// lockWaitSeconds is how long a command waits for the xtables lock another writer holds.
const lockWaitSeconds = "5"

// Interface is what the kubelet does with iptables.
type Interface interface {
	// EnsureChain creates chain in table unless it exists; true when it existed.
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	// EnsureRule adds the rule args to chain at position unless chain holds it; true when
	// it did.
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	// IsIPv6 says whether the client writes IPv6 rules.
	IsIPv6() bool
	// Protocol is the client's IP family.
	Protocol() Protocol
	// Monitor creates canary in each of tables, then every interval until ctx ends checks
	// that they are all there; when one is gone (something flushed the table) it calls
	// reloadFunc and creates them again.
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
}

// runner runs one of the commands for one family.
type runner struct {
	command  string
	protocol Protocol
}

// New returns a client for protocol that runs the installed command of that family.
func New(protocol Protocol) Interface {
	command := "iptables"
	if protocol == ProtocolIPv6 {
		command = "ip6tables"
	}
	return &runner{command: command, protocol: protocol}
}

// NewBestEffort returns a client for each family whose command is installed and can read the
// filter table; none when the host has no usable iptables (the kubelet then sets up nothing).
func NewBestEffort(ctx context.Context, mode Mode) map[Protocol]Interface {
	_ = mode
	clients := map[Protocol]Interface{}
	for _, protocol := range []Protocol{ProtocolIPv4, ProtocolIPv6} {
		client := New(protocol).(*runner)
		if _, err := client.run(ctx, TableFilter, "-S", string(ChainInput)); err == nil {
			clients[protocol] = client
		}
	}
	return clients
}

// notFound is a command's answer that a chain or rule is not there (exit status 1).
var notFound = errors.New("not there")

// run runs the command on table with args; notFound when it exits with status 1 (what
// iptables answers to -S of a missing chain and -C of a missing rule), another error for any
// other failure, with what the command printed.
func (r *runner) run(ctx context.Context, table Table, args ...string) (string, error) {
	full := append([]string{"-w", lockWaitSeconds, "-t", string(table)}, args...)
	cmd := exec.CommandContext(ctx, r.command, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.String(), nil
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 {
		return "", fmt.Errorf("%w: %s %s: %s", notFound, r.command, strings.Join(full, " "), strings.TrimSpace(stderr.String()))
	}
	return "", fmt.Errorf("%s %s: %w: %s", r.command, strings.Join(full, " "), err, strings.TrimSpace(stderr.String()))
}

// chainExists says whether table has chain.
func (r *runner) chainExists(ctx context.Context, table Table, chain Chain) (bool, error) {
	_, err := r.run(ctx, table, "-S", string(chain))
	if errors.Is(err, notFound) {
		return false, nil
	}
	return err == nil, err
}

func (r *runner) EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error) {
	exists, err := r.chainExists(ctx, table, chain)
	if err != nil || exists {
		return exists, err
	}
	if _, err := r.run(ctx, table, "-N", string(chain)); err != nil {
		// Another writer may have created it since the check.
		if again, checkErr := r.chainExists(ctx, table, chain); checkErr == nil && again {
			return true, nil
		}
		return false, err
	}
	return false, nil
}

func (r *runner) EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error) {
	check := append([]string{"-C", string(chain)}, args...)
	_, err := r.run(ctx, table, check...)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, notFound) {
		return false, err
	}
	add := append([]string{string(position), string(chain)}, args...)
	if _, err := r.run(ctx, table, add...); err != nil {
		return false, err
	}
	return false, nil
}

func (r *runner) IsIPv6() bool { return r.protocol == ProtocolIPv6 }

func (r *runner) Protocol() Protocol { return r.protocol }

func (r *runner) Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration) {
	createAll := func() bool {
		for _, table := range tables {
			if _, err := r.EnsureChain(ctx, table, canary); err != nil {
				return false
			}
		}
		return true
	}
	// Without canaries a flush could not be noticed: wait until they can be created.
	for !createAll() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		for _, table := range tables {
			exists, err := r.chainExists(ctx, table, canary)
			if err == nil && !exists {
				reloadFunc()
				createAll()
				break
			}
		}
	}
}
