"""JupyterHub serving the course to a cohort from one machine: ``./course hub`` runs
``jupyterhub -f deploy/jupyterhub/jupyterhub_config.py`` from the course's virtual environment.

Every learner gets a single-user JupyterLab that runs the one shared course environment (the
``.venv`` this hub runs from; learners only read it) and, at each start, their own working copy
of the lessons and exercises in ``~/course`` (made at the first login, then only topped up with
notebooks the course gained, and an exercise saved under its old name, ``NN_name.ipynb``, moved to
``NN_name_exercise.ipynb`` with its edits: ``course_lib/workspace.py``), which JupyterLab opens. Learners never write into the course
checkout. Quiz answers are kept under ``~/.course-quizzes`` as the learner's hub name.

Everything an instructor may change is an environment variable, read below. ``deploy/README.md``
explains the choices; the defaults suit one Linux GPU box run by root.

  COURSE_HUB_IP, COURSE_HUB_PORT  where the hub listens (127.0.0.1:8000; put TLS in front of it)
  COURSE_HUB_STATE                the hub's database, cookie secret and proxy pid: a private folder
                                  outside the checkout (~/.local/state/llm-serving-course/hub,
                                  course_lib/hub_state.py)
  COURSE_HUB_AUTH                 native (default) | dummy (tests only) | lti
  COURSE_HUB_ADMINS               comma-separated hub admins (they approve sign-ups)
  COURSE_HUB_LEARNERS             comma-separated learners allowed in (dummy only: with native sign-up
                                  a listed name would be approved without an admin)
  COURSE_HUB_SPAWNER              system (default) | systemd | simple
  COURSE_HUB_HOMES                the learners' homes with the simple spawner (STATE/homes)
  COURSE_HUB_MEM_LIMIT            per-learner memory (4G), enforced by the systemd spawner
  COURSE_HUB_CPU_LIMIT            per-learner CPU cores (2), enforced by the systemd spawner
  COURSE_HUB_CULL_IDLE_S          stop a learner's server after this long idle (3600)
  COURSE_HUB_GPU                  shared (default) | none | MIG-UUID,MIG-UUID,...
"""

import os
import pwd
import shlex
import sys
from pathlib import Path

from course_lib.hub_state import state_folder

c = get_config()  # noqa: F821 - JupyterHub provides get_config to its config file

COURSE = Path(__file__).resolve().parents[2]  # the course checkout
VENV_BIN = Path(sys.executable).parent  # the hub runs from the course's virtual environment
STATE = state_folder()  # COURSE_HUB_STATE, else a folder of the hub user's outside the checkout
# The hub's database holds every account's password hash and the cookie secret forges any login:
# nobody but the hub may read them, so they live outside the checkout (which every learner's
# server, and a graded notebook's sandbox, can see part of). The umask also keeps each learner's
# new files private to them.
os.umask(0o077)
STATE.mkdir(parents=True, exist_ok=True)
STATE.chmod(0o700)


def names(variable: str) -> set[str]:
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


# --- The hub itself -------------------------------------------------------------------------
# Listen on localhost by default: a cohort reaches the hub through a reverse proxy that holds
# the TLS certificate (nginx, Caddy), never over plain HTTP from outside.
c.JupyterHub.ip = os.environ.get("COURSE_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("COURSE_HUB_PORT", "8000"))
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
proxy = COURSE / ".hub" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"  # ./course hub's install
if proxy.exists():  # else configurable-http-proxy from PATH
    c.ConfigurableHTTPProxy.command = [str(proxy)]
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server

# --- Who may log in -------------------------------------------------------------------------
auth = os.environ.get("COURSE_HUB_AUTH", "native")
c.Authenticator.admin_users = names("COURSE_HUB_ADMINS")
# Nobody logs in as a system account (root, www-data, ...): with the system spawner a server runs
# as the account of the same name, so one careless approval would hand it over.
c.Authenticator.blocked_users = {entry.pw_name for entry in pwd.getpwall() if entry.pw_uid < 1000}
if auth == "native":
    # A class with no identity provider: learners sign up at /hub/signup, an admin approves each
    # one at /hub/authorize, and only approved accounts log in.
    c.JupyterHub.authenticator_class = "native"
    c.NativeAuthenticator.open_signup = False
    c.NativeAuthenticator.minimum_password_length = 10
    c.NativeAuthenticator.allowed_failed_logins = 5  # then a 10-minute lockout
    c.Authenticator.allow_all = True  # every *approved* account
elif auth == "dummy":
    # Tests only: any listed learner logs in with the one shared password. Never for a class.
    c.JupyterHub.authenticator_class = "dummy"
    c.DummyAuthenticator.password = os.environ["COURSE_HUB_DUMMY_PASSWORD"]
    c.Authenticator.allowed_users = names("COURSE_HUB_LEARNERS")
elif auth == "lti":
    # From an LMS (Canvas, Moodle, Blackboard) with LTI 1.3: `pip install jupyterhub-ltiauthenticator`,
    # register the hub as an LTI tool in the LMS, and give the LMS's endpoints here. LMS user names
    # have no OS accounts: use COURSE_HUB_SPAWNER=systemd (dynamic users) with it.
    c.JupyterHub.authenticator_class = "ltiauthenticator.lti13.auth.LTI13Authenticator"
    c.LTI13Authenticator.issuer = os.environ["COURSE_HUB_LTI_ISSUER"]
    c.LTI13Authenticator.client_id = [os.environ["COURSE_HUB_LTI_CLIENT_ID"]]
    c.LTI13Authenticator.authorize_url = os.environ["COURSE_HUB_LTI_AUTHORIZE_URL"]
    c.LTI13Authenticator.jwks_endpoint = os.environ["COURSE_HUB_LTI_JWKS_URL"]
    c.Authenticator.allow_all = True  # whoever the LMS sends
else:
    raise ValueError(f"COURSE_HUB_AUTH={auth!r}: use native, dummy (tests) or lti.")

# --- Each learner's server ------------------------------------------------------------------
idle = int(os.environ.get("COURSE_HUB_CULL_IDLE_S", "3600"))
# Kernels idle that long are shut down too (each holds a few hundred MB, and a GPU context),
# even while their notebook's tab stays open; the idle culler at the end stops whole servers.
server_args = [f"--MappingKernelManager.cull_idle_timeout={idle}", "--MappingKernelManager.cull_interval=300",
               "--MappingKernelManager.cull_connected=True"]
spawner = os.environ.get("COURSE_HUB_SPAWNER", "system")
if spawner == "system":
    # One OS account per learner (create them first: `sudo adduser alice`); the hub runs as root
    # and starts each server as its learner. Homes must be private (mode 700: Debian's adduser
    # default; on older Ubuntu set DIR_MODE=0700 in /etc/adduser.conf) for learners not to read
    # each other's work, and the course checkout readable by all (clone it to /opt/course).
    c.JupyterHub.spawner_class = "localprocess"
elif spawner == "systemd":
    # `pip install jupyterhub-systemdspawner`: each server in a systemd unit, which enforces the
    # memory and CPU limits below; dynamic users need no accounts made by hand.
    c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
    c.SystemdSpawner.dynamic_users = True
    c.SystemdSpawner.readonly_paths = [str(COURSE)]
elif spawner == "simple":
    # Every learner as the hub's own OS user, homes side by side: for a trial run or a test,
    # never for a class (nothing keeps one learner out of another's files).
    c.JupyterHub.spawner_class = "simple"
    homes = Path(os.environ.get("COURSE_HUB_HOMES", STATE / "homes")).resolve()
    c.SimpleLocalProcessSpawner.home_dir_template = str(homes / "{username}")
    if os.geteuid() == 0:  # a container run as root: JupyterLab refuses root unless told
        server_args.append("--allow-root")
else:
    raise ValueError(f"COURSE_HUB_SPAWNER={spawner!r}: use system, systemd or simple.")

# The working copy first (as the learner, in their home), then JupyterLab from the shared venv.
# Python runs isolated (-I: nothing in the learner's home can stand in for the course's code), and
# a copy that fails (a learner's odd files in the way) is reported without keeping them out.
# JupyterLab then runs in the working copy, as under `./course lab`: its folder is the file
# browser's root (no notebook_dir: the server's folder) and where a Terminal opens, so the copy's
# own ./course (workspace.py) is at hand there: ./course grade exercises/NN_name_exercise.ipynb.
start = (f'{shlex.quote(str(VENV_BIN / "python"))} -I -m course_lib.workspace --workdir "$HOME/course" '
         f'|| echo "course: could not update the working copy in $HOME/course (see above)" >&2; '
         f'export COURSE_WORKDIR="$HOME/course"; cd "$COURSE_WORKDIR" || cd "$HOME"; '
         f'exec {shlex.quote(str(VENV_BIN / "jupyterhub-singleuser"))} "$@"')
c.Spawner.cmd = ["/bin/bash", "-c", start, "course-singleuser"]  # the spawner's arguments follow as "$@"
c.Spawner.args = server_args
c.Spawner.default_url = "/lab/tree/notebooks/00_start_here.ipynb"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.mem_limit = os.environ.get("COURSE_HUB_MEM_LIMIT", "4G")
c.Spawner.cpu_limit = float(os.environ.get("COURSE_HUB_CPU_LIMIT", "2"))

environment = {"COURSE_LEARNER": lambda spawner: spawner.user.name}  # names the learner's scorecards
# How learners share the GPU (deploy/README.md compares the three):
gpu = os.environ.get("COURSE_HUB_GPU", "shared")
# On one box these are agreements, not walls: CUDA_VISIBLE_DEVICES is an environment variable a
# learner can change, and /dev/nvidia* are open to every local user. Only the systemd spawner's
# isolate_devices (for "none") or Kubernetes' device plugin enforce them.
if gpu == "none":  # CPU-only learners: the course runs everything on CPUs too
    environment["CUDA_VISIBLE_DEVICES"] = ""
    if spawner == "systemd":
        c.SystemdSpawner.isolate_devices = True
elif gpu != "shared":  # one MIG slice per learner, handed out by user id (stable across restarts)
    slices = [uuid.strip() for uuid in gpu.split(",") if uuid.strip()]
    environment["CUDA_VISIBLE_DEVICES"] = lambda spawner: slices[spawner.user.id % len(slices)]
# "shared": every learner sees the whole GPU; CUDA time-slices between their processes, and
# each process holds its own memory, so set the course's gpu_memory_utilization low.
c.Spawner.environment = environment

# --- Stop idle servers ----------------------------------------------------------------------
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={idle}"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
