package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// cmdGPU administers single GPUs (docs/reference/gpu-truth.md): drain, undrain,
// free (an admin's word that a releasing or unhealthy GPU is clean and
// well).
func cmdGPU(ctx context.Context, env *Env, args []string) error {
	usage := "usage: arbiter gpu drain|undrain|free MACHINE:INDEX [--reason R]"
	if len(args) == 0 {
		return UsageError{usage}
	}
	verb := args[0]
	switch verb {
	case "drain", "undrain", "free":
	case "-h", "--help", "help":
		fmt.Fprintln(env.Stderr, usage+"\n\n"+
			"  drain    place nothing new on the GPU; its holder keeps it until it ends\n"+
			"  undrain  place allocations on it again\n"+
			"  free     end its releasing and unhealthy states now (it is clean and well)")
		return nil
	default:
		return Usagef("unknown gpu command %q; %s", verb, usage)
	}
	fs, cf := NewClientFlags(env, "gpu "+verb, " MACHINE:INDEX")
	reason := ""
	if verb != "free" {
		fs.StringVar(&reason, "reason", "", "why (recorded with the GPU's state and its event)")
	}
	pos, err := parseArgs(env, fs, cf, args[1:], 1, "exactly one GPU as MACHINE:INDEX")
	if err != nil {
		return HelpOK(err)
	}
	machine, index, err := parseGPURef(pos[0])
	if err != nil {
		return err
	}
	c := cf.Client()
	var m arbiter.MachineStatus
	switch verb {
	case "drain", "undrain":
		if reason == "" {
			reason = verb + "ed by " + defaultOwner(env)
		}
		m, err = c.SetGPUDrained(ctx, machine, index, verb == "drain", reason)
	default:
		m, err = c.FreeGPU(ctx, machine, index)
	}
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, m)
	}
	for _, d := range m.Devices {
		if d.Index == index {
			state := orDash(d.State)
			if d.StateReason != "" {
				state += " (" + d.StateReason + ")"
			}
			if _, err = fmt.Fprintf(env.Stdout, "GPU %d of %s: %s\n", index, machine, state); err != nil {
				return err
			}
			if verb == "free" && d.State == arbiter.GPUDrained {
				// free ends releasing and unhealthy, not an admin's drain.
				fmt.Fprintf(env.Stderr, "arbiter gpu: still drained; arbiter gpu undrain %s:%d places allocations on it again\n", machine, index)
			}
			return nil
		}
	}
	return nil
}

// parseGPURef reads MACHINE:INDEX.
func parseGPURef(s string) (string, int, error) {
	machine, idx, ok := strings.Cut(s, ":")
	if !ok || machine == "" {
		return "", 0, Usagef("%q is not MACHINE:INDEX, like gpu1:3", s)
	}
	if err := arbiter.ValidateName("machine", machine); err != nil {
		return "", 0, UsageError{arbiter.ErrorMessage(err)}
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || i > 1<<16 {
		return "", 0, Usagef("GPU index %q in %q is not a whole number, 0 or more", idx, s)
	}
	return machine, i, nil
}
