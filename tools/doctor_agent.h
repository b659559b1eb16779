/*
 * tools/doctor_agent.h — `mpengine doctor --agent --host NAME`, the hidden mode doctor starts on
 * every host through the remote shell (tools/cmd_doctor.c).
 *
 * It prints its host's facts as one JSON line (tools/doctor_report.h) and then answers commands
 * on stdin, one line each, until `quit` or the end of stdin:
 *   allow ADDR...            accept connections on its listener from these addresses only
 *   connect MS ADDR:PORT...  open a TCP connection to each at once; one line "ADDR:PORT OUTCOME
 *                            SECONDS" each (OUTCOME ok, refused, no route, timed out), then "end"
 *   measure ADDR:PORT        ping-pong and stream to that agent: "measure LATENCY_US GBYTES_PER_S"
 *   time                     "time SECONDS" on this host's real-time clock
 * It ends itself after MP_DOCTOR_AGENT_LIFETIME_S whatever happens: no agent outlives a doctor.
 */
#ifndef MPENGINE_TOOLS_DOCTOR_AGENT_H
#define MPENGINE_TOOLS_DOCTOR_AGENT_H

enum { MP_DOCTOR_AGENT_LIFETIME_S = 120 };

/* Runs the agent; returns the process exit code. */
int doctor_agent_main(const char *host);

#endif /* MPENGINE_TOOLS_DOCTOR_AGENT_H */
