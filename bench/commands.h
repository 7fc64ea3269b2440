/* kvdrift: the subcommands. Each takes argv after its own name and returns
 * the process exit code. */
#ifndef KVD_COMMANDS_H
#define KVD_COMMANDS_H

int kvd_cmd_forward(int argc, char **argv);
int kvd_cmd_export(int argc, char **argv);
int kvd_cmd_calibrate(int argc, char **argv);
int kvd_cmd_bench(int argc, char **argv);
int kvd_cmd_trace(int argc, char **argv);
int kvd_cmd_run(int argc, char **argv);
int kvd_cmd_report(int argc, char **argv);
int kvd_cmd_trend(int argc, char **argv);
int kvd_cmd_compare(int argc, char **argv);
int kvd_cmd_audit(int argc, char **argv);
int kvd_cmd_plan(int argc, char **argv);

#endif
