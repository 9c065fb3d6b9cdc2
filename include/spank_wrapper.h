/*
 * spank_wrapper.h: the one header bindgen reads for the slurm-htc SPANK plugin
 * (spank-plugin/build.rs). It pulls in the public SPANK API of the Slurm the plugin is
 * built against; plugin_version is taken from SLURM_VERSION_NUMBER, so the plugin must be
 * built against the headers of the Slurm that will load it (same major.minor).
 *
 * Debian/Ubuntu: libslurm-dev. RHEL & co: slurm-devel. A Slurm under a custom prefix:
 * set SLURM_INCLUDE_DIR=<prefix>/include when building.
 */
#ifndef HTC_SPANK_WRAPPER_H
#define HTC_SPANK_WRAPPER_H

#include <stdint.h>
#include <sys/types.h>

#include <slurm/spank.h>
#include <slurm/slurm_version.h>

/*
 * The step id of a job's batch step. It lives in <slurm/slurm.h> (SLURM_BATCH_SCRIPT),
 * which is large and not needed otherwise; its value has been 0xfffffffb since Slurm 20.11.
 */
#define HTC_SLURM_BATCH_SCRIPT 0xfffffffbU

#endif /* HTC_SPANK_WRAPPER_H */
