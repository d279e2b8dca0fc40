//! The RESP a fake Redis server in a test reads and writes: a command (an array of bulk
//! strings) and a bulk string reply. For servers that misbehave on purpose; a real one is
//! [`LocalRedis`](super::LocalRedis).

use std::io::BufRead;

/// One command's arguments, or `None` at end of stream or on anything that is not an array
/// of bulk strings (a fake server then stops answering).
pub fn read_command(r: &mut impl BufRead) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    r.read_line(&mut line).ok().filter(|&n| n > 0)?;
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n.min(16));
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0; len.checked_add(2)?];
        r.read_exact(&mut arg).ok()?;
        arg.truncate(len);
        args.push(arg);
    }
    Some(args)
}

/// `v` as a bulk string reply.
pub fn bulk(v: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", v.len()).into_bytes();
    out.extend_from_slice(v);
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_reads_back_as_its_arguments() {
        let wire = b"*2\r\n$4\r\nECHO\r\n$3\r\na\r\n\r\n*1\r\n$4\r\nPING\r\n";
        let mut r = std::io::BufReader::new(&wire[..]);
        assert_eq!(
            read_command(&mut r),
            Some(vec![b"ECHO".to_vec(), b"a\r\n".to_vec()])
        );
        assert_eq!(read_command(&mut r), Some(vec![b"PING".to_vec()]));
        assert_eq!(read_command(&mut r), None);
        assert_eq!(bulk(b"a\r\n"), b"$3\r\na\r\n\r\n".to_vec());
    }
}
