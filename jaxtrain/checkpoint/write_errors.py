"""Why a checkpoint write failed, and what to do about it, for the one-line save error.

A full disk and a directory the run may not write into need different advice: "free space"
does nothing for permission denied. Orbax raises its own exception types with the OS error's
text inside, so a reason is recognised by its errno where there is one, else by that text.
"""

import errno

# (errnos, the OS's text for them, what to do), most specific first.
_CAUSES = (
    ((errno.ENOSPC, errno.EDQUOT), ('No space left on device', 'Disk quota exceeded'), 'Free space'),
    ((errno.EFBIG,), ('File too large',), 'Free space or use a file system without that file-size limit'),
    (
        (errno.EACCES, errno.EPERM),
        ('Permission denied', 'Operation not permitted'),
        'Make the checkpoint_dir writable by this user, or pass another --checkpoint_dir',
    ),
    ((errno.EROFS,), ('Read-only file system',), 'Pass a --checkpoint_dir on a writable file system'),
)
_OTHER = 'Fix the cause named'


def write_failure(error: BaseException) -> tuple[str, str]:
    """(reason, advice) for a failed write: the OS's reason where it is a known one (else the
    error's own text, shortened) and what to do, without a trailing full stop."""
    text = ' '.join(str(error).split())
    code = getattr(error, 'errno', None)
    for codes, reasons, advice in _CAUSES:
        if code in codes:
            return getattr(error, 'strerror', None) or reasons[0], advice
        found = next((r for r in reasons if r in text), None)
        if found:
            return found, advice
    return (getattr(error, 'strerror', None) or text[:160] or type(error).__name__), _OTHER
