//! The request body the benches send: a tools/call of a stamped tool
//! (chat_send: "sender" is stamped), padded to about 300 bytes.

pub fn tools_call_body() -> Vec<u8> {
    let mut msg = String::from("benchmark message ");
    let make = |m: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"chat_send","arguments":{{"channel":"general","message":"{m}","reply_to":null}},"_meta":{{"progressToken":7}}}}}}"#
        )
    };
    while make(&msg).len() < 300 {
        msg.push('x');
    }
    make(&msg).into_bytes()
}
